//! Every route llama-server registers, read from the source it was built from
//! (`tools/server/server.cpp` of the sdist `scripts/setup-llama.sh` unpacks), is classified in
//! slotgate's route table, and the table names no route llama-server lacks: the next llama.cpp
//! release cannot silently 404 through slotgate.

use slotgate::pipeline::routes::{lookup, Vertex, ROUTES, VERTEX_PREDICT_DEFAULT};
use slotgate_tests::llama::LlamaPaths;

/// `(METHOD, path)` of every `ctx_http.get|post|put|del("path", ...)` registration in `source`.
fn registrations(source: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("ctx_http.") {
        rest = &rest[at + "ctx_http.".len()..];
        let Some(open) = rest.find('(') else { break };
        let verb = rest[..open].trim();
        let method = match verb {
            "get" => "GET",
            "post" => "POST",
            "put" => "PUT",
            "del" => "DELETE",
            _ => continue,
        };
        let args = rest[open + 1..].trim_start();
        let Some(args) = args.strip_prefix('"') else {
            continue;
        };
        let Some(end) = args.find('"') else { break };
        found.push((method.to_owned(), args[..end].to_owned()));
    }
    found
}

fn unclassified(source: &str) -> Vec<String> {
    registrations(source)
        .into_iter()
        .filter(|(m, p)| lookup(m, p).is_none())
        .map(|(m, p)| format!("{m} {p}"))
        .collect()
}

#[test]
fn every_route_llama_server_registers_is_classified() {
    let path = LlamaPaths::get().source.join("tools/server/server.cpp");
    let source = std::fs::read_to_string(&path).unwrap();
    let found = registrations(&source);
    // The parser reads this source: the routes every build has are among what it found.
    for (m, p) in [
        ("POST", "/v1/chat/completions"),
        ("GET", "/health"),
        ("POST", "/slots/:id_slot"),
    ] {
        assert!(
            found.iter().any(|(fm, fp)| fm == m && fp == p),
            "{m} {p} not found in {}: the parser no longer reads it",
            path.display()
        );
    }
    assert!(
        found.len() >= 50,
        "only {} routes in {}",
        found.len(),
        path.display()
    );
    let missing = unclassified(&source);
    assert!(
        missing.is_empty(),
        "{} registers routes slotgate's table (sidecar/src/routes.rs) does not classify: {missing:?}",
        path.display()
    );
    // And the table holds nothing llama-server lacks.
    let stale: Vec<String> = ROUTES
        .iter()
        .filter(|r| !found.iter().any(|(m, p)| m == r.method && p == r.path))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        stale.is_empty(),
        "routes the source does not register: {stale:?}"
    );
}

#[test]
fn a_new_route_in_the_source_fails_the_check() {
    let source = r#"
        ctx_http.get ("/health",   ex_wrapper(routes.get_health));
        ctx_http.post("/v1/brand-new", ex_wrapper(routes.post_new));
        ctx_http.del ("/v1/stream", ex_wrapper(stream_delete_h));
    "#;
    assert_eq!(
        registrations(source),
        [
            ("GET".to_owned(), "/health".to_owned()),
            ("POST".into(), "/v1/brand-new".into()),
            ("DELETE".into(), "/v1/stream".into())
        ]
    );
    assert_eq!(unclassified(source), ["POST /v1/brand-new"]);
}

/// Vertex AI's predict route is registered apart (`register_gcp_compat` in `server-http.cpp`, under
/// `AIP_MODE=PREDICTION`), at `AIP_PREDICT_ROUTE` or a default slotgate must share.
#[test]
fn the_vertex_predict_route_is_where_llama_server_puts_it() {
    let path = LlamaPaths::get()
        .source
        .join("tools/server/server-http.cpp");
    let source = std::fs::read_to_string(&path).unwrap();
    assert!(
        source.contains("getenv(\"AIP_MODE\", \"\") == \"PREDICTION\""),
        "{} no longer turns the Vertex routes on with AIP_MODE=PREDICTION",
        path.display()
    );
    let default = format!("getenv(\"AIP_PREDICT_ROUTE\", \"{VERTEX_PREDICT_DEFAULT}\"");
    assert!(
        source.contains(&default),
        "{} no longer defaults the predict route to {VERTEX_PREDICT_DEFAULT}",
        path.display()
    );
    assert!(source.contains("post(gcp.path_predict"));
    assert!(source.contains("getenv(\"AIP_HEALTH_ROUTE\""));
    assert!(Vertex::from_env(|k| (k == "AIP_MODE").then(|| "PREDICTION".to_owned())).is_some());
}
