//! The console's files on the admin listener (docs/console.md): served without a token (they hold no
//! data) under a strict Content-Security-Policy, with their content types, `nosniff` and an ETag
//! that turns a second fetch into a 304; `/` leads to the page; everything the page shows still
//! needs the token. The page itself is driven in a real browser by the `console` binary.

use http::Method;
use slotgate_tests::gate::Gate;

const TOKEN: &str = "admin-token-for-the-console";

/// The files the page loads, with the type each must be served as.
const FILES: &[(&str, &str)] = &[
    ("/console/", "text/html; charset=utf-8"),
    ("/console/console.css", "text/css; charset=utf-8"),
    ("/console/app.js", "text/javascript; charset=utf-8"),
    ("/console/api.js", "text/javascript; charset=utf-8"),
    ("/console/live.js", "text/javascript; charset=utf-8"),
    ("/console/usage.js", "text/javascript; charset=utf-8"),
    (
        "/console/vendor/uplot/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
    ),
    ("/console/vendor/uplot/LICENSE", "text/plain; charset=utf-8"),
    ("/console/favicon.svg", "image/svg+xml"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consoles_files_need_no_token_and_carry_a_strict_policy_the_data_still_does() {
    let (_up, gate) = Gate::new().admin_token(TOKEN).start_instant().await;
    let bare = gate.admin().clone().without_bearer();

    let home = bare.get("/").await;
    assert_eq!(home.status, 307, "{}", home.body);
    assert_eq!(home.header("location").as_deref(), Some("/console/"));
    assert_eq!(
        bare.get("/console").await.header("location").as_deref(),
        Some("/console/")
    );

    for (path, content_type) in FILES {
        let r = bare.get(path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_eq!(
            r.header("content-type").as_deref(),
            Some(*content_type),
            "{path}"
        );
        assert_eq!(
            r.header("x-content-type-options").as_deref(),
            Some("nosniff")
        );
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(csp.starts_with("default-src 'self'"), "{path}: {csp}");
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("unsafe"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(r.header("cache-control").as_deref(), Some("no-cache"));
        let etag = r
            .header("etag")
            .unwrap_or_else(|| panic!("{path}: no ETag"));
        // The same bytes again: 304, no body, the same tag.
        let again = bare.get_with(path, &[("if-none-match", &etag)]).await;
        assert_eq!(again.status, 304, "{path}");
        assert!(again.body.is_empty());
        assert_eq!(again.header("etag"), Some(etag.clone()));
        let other = bare
            .get_with(path, &[("if-none-match", "\"something-else\"")])
            .await;
        assert_eq!(other.status, 200, "{path}");
        // HEAD: the length, no body.
        let head = bare.request(Method::HEAD, path).await;
        assert_eq!(head.status, 200);
        assert_eq!(
            head.header("content-length"),
            Some(r.body.len().to_string()),
            "{path}"
        );
    }

    // The page names only files of its own: nothing inline, nothing from elsewhere.
    let index = bare.get("/console/").await.body;
    assert!(
        !index.contains("<script>") && !index.contains("style="),
        "{index}"
    );
    assert!(!index.contains("http://") && !index.contains("https://"));

    let missing = bare.get("/console/nothing.js").await;
    assert_eq!(missing.status, 404);
    assert!(missing.header("content-security-policy").is_some());

    // What the page shows needs the token as before; changing the page is nobody's.
    for path in ["/live", "/status", "/quotas", "/usage", "/keys"] {
        assert_eq!(bare.get(path).await.status, 401, "{path}");
    }
    assert_eq!(bare.request(Method::POST, "/console/").await.status, 401);
    let post = gate.admin().request(Method::POST, "/console/").await;
    assert_eq!(post.status, 405);
    assert_eq!(post.header("allow").as_deref(), Some("GET, HEAD"));
}
