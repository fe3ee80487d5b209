//! Keys slotgate issues (docs/keys.md), on the fake llama-server playing `--api-key`: under
//! `--client-auth keys` a key made with `slotgate key create` is served under its tenant's name,
//! while no key, a made-up, revoked or expired key get a 401 in the API's own shape before anything
//! is counted, queued or kept, and never reach llama-server, which sees slotgate's own key only.
//! Keys and revocations survive a SIGKILL; no secret is in a log, an answer or the store.

mod file;
mod scopes;

use std::path::Path;
use std::time::Duration;

use http::Method;
use serde_json::{json, Value};
use slotgate_tests::fake_upstream::{FakeUpstream, RunningUpstream};
use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::request::CHAT;
use slotgate_tests::wait::unique_dir;

/// The key llama-server (the fake) takes: slotgate's own, never a caller's.
const UPSTREAM_KEY: &str = "sk-llama-server-key-0001";
const ADMIN: &str = "admin-token-for-keys";

/// A gate under `--client-auth keys`, its state in `state` (kept across restarts), holding
/// llama-server's key for its own calls.
fn keyed(state: &Path, queue: usize) -> Gate {
    std::fs::create_dir_all(state).unwrap();
    let key_file = state.join("upstream-key");
    std::fs::write(&key_file, format!("{UPSTREAM_KEY}\n")).unwrap();
    Gate::one_slot(queue)
        .opt("--client-auth", "keys")
        .opt("--state-dir", state.join("state").display())
        .opt("--upstream-api-key-file", key_file.display())
        .admin_token(ADMIN)
}

fn upstream() -> FakeUpstream {
    FakeUpstream::instant().api_key(UPSTREAM_KEY)
}

fn cli(gate: &RunningGate, args: &[&str]) -> (bool, String, String) {
    gate.admin_cli(args)
}

/// `slotgate key create ARGS --json`: the key's id and its secret.
fn create(gate: &RunningGate, args: &[&str]) -> (String, String) {
    let mut all = vec!["key", "create", "--json"];
    all.extend_from_slice(args);
    let (ok, out, err) = cli(gate, &all);
    assert!(ok, "key create failed: {out}{err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    (
        v["id"].as_str().unwrap().to_owned(),
        v["secret"].as_str().unwrap().to_owned(),
    )
}

fn chat() -> String {
    json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        .to_string()
}

async fn chat_with(
    gate: &RunningGate,
    headers: &[(&str, &str)],
) -> slotgate_tests::client::Response {
    gate.client()
        .send_with(Method::POST, CHAT, headers, chat())
        .await
}

/// The caller's key never reached llama-server: every request it saw carried slotgate's (or none:
/// slotgate's own keyless probe of whether llama-server checks keys).
fn only_slotgates_key_reached(up: &RunningUpstream, secrets: &[&str]) {
    for (path, auth, api_key) in up.credentials_seen() {
        if auth.is_none() && api_key.is_none() && path == "/v1/models" {
            continue;
        }
        assert_eq!(
            auth.as_deref(),
            Some(format!("Bearer {UPSTREAM_KEY}").as_str()),
            "{path}: llama-server saw another credential"
        );
        assert_eq!(
            api_key, None,
            "{path}: a caller's x-api-key reached llama-server"
        );
        for s in secrets {
            assert!(!format!("{auth:?}").contains(s));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_is_served_under_its_tenant_and_others_are_refused_before_anything() {
    let state = unique_dir("keys-life");
    let (up, gate) = keyed(&state, 8).start_with(upstream()).await;
    let (id, secret) = create(&gate, &["--tenant", "alice", "--team", "research"]);
    assert!(
        secret.starts_with("sgk_") && secret.contains(&id),
        "{secret}"
    );

    // Served, in both headers, its tenant named everywhere.
    let bearer = format!("Bearer {secret}");
    for headers in [
        &[("authorization", bearer.as_str())][..],
        &[("x-api-key", &secret)],
    ] {
        let resp = chat_with(&gate, headers).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    // The load a router polls: to an issued key only, without showing it to llama-server.
    let loads = gate
        .client()
        .get_with("/v1/loads", &[("x-api-key", &secret)])
        .await;
    assert_eq!(loads.status, 200, "{}", loads.body);
    let loads = gate
        .client()
        .get_with("/v1/loads", &[("x-api-key", "sk-made-up")])
        .await;
    assert_eq!(loads.status, 401, "{}", loads.body);
    only_slotgates_key_reached(&up, &[&secret]);
    let served = up.count();

    // No key, a made-up one, one of slotgate's shape: 401 in OpenAI's shape, nothing forwarded.
    for headers in [
        &[][..],
        &[("authorization", "Bearer sk-made-up")],
        &[(
            "x-api-key",
            "sgk_0123456789ab_000000000000000000000000000000000000000000000000",
        )],
        &[("authorization", &secret[..secret.len() - 1])],
    ] {
        let resp = chat_with(&gate, headers).await;
        assert_eq!(resp.status, 401, "{headers:?}: {}", resp.body);
        let v = resp.json();
        assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(
            resp.header("x-slotgate-reason").as_deref(),
            Some("unauthorized")
        );
    }
    // Anthropic's API gets Anthropic's shape.
    let resp = gate
        .client()
        .send_with(
            Method::POST,
            "/v1/messages",
            &[("x-api-key", "sk-ant-made-up")],
            json!({"model": "fake", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
                .to_string(),
        )
        .await;
    assert_eq!(resp.status, 401, "{}", resp.body);
    assert_eq!(
        resp.json()["error"]["type"],
        "authentication_error",
        "{}",
        resp.body
    );
    assert_eq!(up.count(), served, "no refused caller reached llama-server");
    // Four chats and the load poll above.
    gate.wait_metric(
        "slotgate_callers_refused_total",
        &[("reason", "unknown_key")],
        5.0,
    )
    .await;
    gate.wait_metric(
        "slotgate_callers_refused_total",
        &[("reason", "no_key")],
        1.0,
    )
    .await;

    // The list shows the key without its secret; the ledger and the live view name alice.
    let (ok, list, err) = cli(&gate, &["key", "list"]);
    assert!(ok, "{err}");
    assert!(
        list.contains(&id) && list.contains("alice") && list.contains("research"),
        "{list}"
    );
    assert!(!list.contains(&secret[20..]), "the list shows no secret");
    gate.wait_outcome("ok", 2).await;
    let usage = gate.admin_get("/usage?format=csv").await;
    assert!(usage.body.contains(",alice,"), "{}", usage.body);
    assert!(
        !usage.body.contains("sha256:"),
        "one name only: {}",
        usage.body
    );

    // Revoked: refused at once, told so.
    let (ok, out, err) = cli(&gate, &["key", "revoke", &id]);
    assert!(ok && out.contains("revoked"), "{out}{err}");
    let resp = chat_with(&gate, &[("authorization", &bearer)]).await;
    assert_eq!(resp.status, 401, "{}", resp.body);
    assert!(resp.body.contains("revoked"), "{}", resp.body);
    assert_eq!(up.count(), served);

    // No secret anywhere it could leak: answers, logs, the store.
    let status = gate.admin_get("/status").await.body;
    let keys = gate.admin_get("/keys").await.body;
    let stderr = gate.stderr_text();
    let store = std::fs::read(state.join("state/state.redb")).unwrap();
    let hex = &secret[secret.len() - 48..];
    for (what, text) in [
        ("/status", status.as_str()),
        ("/keys", &keys),
        ("the log", &stderr),
    ] {
        assert!(!text.contains(hex), "{what} holds the secret");
    }
    assert!(
        !store.windows(hex.len()).any(|w| w == hex.as_bytes()),
        "the store holds the secret in clear"
    );
    assert!(
        stderr.contains("tenant=alice"),
        "the access line names alice:\n{stderr}"
    );
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_and_revocations_survive_a_sigkill_and_a_rotation_keeps_the_old_secret_for_its_grace()
{
    let state = unique_dir("keys-kill");
    let up = upstream().start().await;
    let gate = keyed(&state, 8).upstream(&up).start().await;
    let (kept_id, kept) = create(&gate, &["--tenant", "bob"]);
    let (gone_id, gone) = create(&gate, &["--tenant", "carol", "--expires", "30d"]);
    let (ok, _, err) = cli(&gate, &["key", "revoke", &gone_id]);
    assert!(ok, "{err}");
    gate.signal("KILL");
    drop(gate);

    let gate = keyed(&state, 8).upstream(&up).start().await;
    let ok = chat_with(&gate, &[("x-api-key", &kept)]).await;
    assert_eq!(ok.status, 200, "a key outlives a SIGKILL: {}", ok.body);
    let no = chat_with(&gate, &[("x-api-key", &gone)]).await;
    assert_eq!(no.status, 401, "so does its revocation: {}", no.body);

    // Rotated with a grace: both secrets work, then only the new one.
    let (ok, out, err) = cli(
        &gate,
        &["key", "rotate", &kept_id, "--grace", "2s", "--json"],
    );
    assert!(ok, "{out}{err}");
    let fresh = serde_json::from_str::<Value>(out.trim()).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(fresh, kept);
    for s in [&kept, &fresh] {
        assert_eq!(chat_with(&gate, &[("x-api-key", s)]).await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(chat_with(&gate, &[("x-api-key", &kept)]).await.status, 401);
    assert_eq!(chat_with(&gate, &[("x-api-key", &fresh)]).await.status, 200);
    only_slotgates_key_reached(&up, &[&kept, &fresh, &gone]);

    // The audit trail names each change by id, never with a secret.
    let stderr = gate.stderr_text();
    assert!(
        stderr.contains("key_rotate") && stderr.contains(&kept_id),
        "{stderr}"
    );
    assert!(!stderr.contains(&fresh[20..]));
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_may_use_only_its_models_and_the_admin_api_needs_the_admin_token() {
    let state = unique_dir("keys-scope");
    let (up, gate) = keyed(&state, 8).start_with(upstream()).await;
    let (_, secret) = create(&gate, &["--tenant", "dana", "--models", "fake,other"]);
    let (_, narrow) = create(&gate, &["--tenant", "erin", "--models", "elsewhere"]);
    assert_eq!(
        chat_with(&gate, &[("x-api-key", &secret)]).await.status,
        200
    );
    let resp = chat_with(&gate, &[("x-api-key", &narrow)]).await;
    assert_eq!(resp.status, 404, "{}", resp.body);
    assert_eq!(resp.json()["error"]["code"], "model_not_found");
    assert!(resp.body.contains("do not have access"), "{}", resp.body);
    assert_eq!(up.count(), 1);

    // Bad input is refused with what is wrong, and nothing is made.
    for args in [
        &["--tenant", "a b"][..],
        &["--tenant", "x", "--expires", "soon"],
        &["--tenant", "x", "--label", "novalue"],
    ] {
        let mut all = vec!["key", "create"];
        all.extend_from_slice(args);
        let (ok, out, err) = cli(&gate, &all);
        assert!(!ok, "{args:?} was taken: {out}");
        assert!(!err.is_empty());
    }
    let (ok, out, _) = cli(&gate, &["key", "revoke", "000000000000"]);
    assert!(!ok, "{out}");
    // Without the token: nothing listed, nothing made.
    let anon = gate.admin().clone().without_bearer();
    assert_eq!(anon.get("/keys").await.status, 401);
    let made = anon.post_json("/keys", &json!({"tenant": "mallory"})).await;
    assert_eq!(made.status, 401);
    let (_, list, _) = cli(&gate, &["key", "list", "--json"]);
    assert_eq!(serde_json::from_str::<Value>(&list).unwrap()["count"], 2);
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_made_up_keys_takes_no_queue_place_and_leaves_nothing() {
    let state = unique_dir("keys-flood");
    let up = FakeUpstream::instant()
        .api_key(UPSTREAM_KEY)
        .delay(Duration::from_millis(50))
        .start()
        .await;
    // The tarpit off: this test measures what 20,000 refusals leave behind, as a flood from as
    // many peers would (one peer's is slowed: `a_flood_from_one_peer_is_slowed_and_the_valid_client_is_not`).
    let gate = keyed(&state, 4)
        .opt("--refusal-rate", "0")
        .upstream(&up)
        .start()
        .await;
    let (_, secret) = create(&gate, &["--tenant", "valid"]);
    let rss = |pid: u32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap()
    };
    let store = state.join("state/state.redb");
    let size = || std::fs::metadata(&store).unwrap().len();
    // Warm: the valid client's own first requests.
    for _ in 0..4 {
        assert_eq!(
            chat_with(&gate, &[("x-api-key", &secret)]).await.status,
            200
        );
    }
    let (rss_before, size_before) = (rss(gate.pid()), size());

    // 32 flooders, 20,000 distinct made-up keys, while the valid client sends 8 chats in a row.
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut flood = Vec::new();
    for f in 0..32 {
        let client = gate.client();
        let sent = sent.clone();
        flood.push(tokio::spawn(async move {
            let mut refused = 0;
            loop {
                let n = sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= 20_000 {
                    return refused;
                }
                let key = format!("sk-made-up-{f}-{n}");
                let r = client
                    .send_with(Method::POST, CHAT, &[("x-api-key", key.as_str())], chat())
                    .await;
                assert_eq!(r.status, 401, "{}", r.body);
                refused += 1;
            }
        }));
    }
    for _ in 0..8 {
        let r = chat_with(&gate, &[("x-api-key", &secret)]).await;
        assert_eq!(r.status, 200, "the valid client is served: {}", r.body);
    }
    let mut refused = 0;
    for f in flood {
        refused += f.await.unwrap();
    }
    assert_eq!(refused, 20_000);
    assert_eq!(up.count(), 12, "no made-up key reached llama-server");
    let (rss_after, size_after) = (rss(gate.pid()), size());
    assert_eq!(size_after, size_before, "nothing stored for a made-up key");
    assert!(
        rss_after < rss_before + 16 * 1024,
        "RSS grew from {rss_before} kB to {rss_after} kB over 20,000 made-up keys"
    );
    gate.wait_outcome("ok", 12).await;
    let usage = gate.admin_get("/usage?format=csv").await.body;
    assert!(
        !usage.contains("sha256:") && usage.contains(",valid,"),
        "{usage}"
    );
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn policies_of_both_contracts_read_the_keys_tenant_team_id_and_labels() {
    let state = unique_dir("keys-probe");
    let config = state.join("probes.toml");
    std::fs::write(
        &config,
        format!(
            "[[policy]]\nname = \"probe-v1\"\npath = {:?}\n\n[[policy]]\nname = \"probe-v2\"\npath = {:?}\n",
            slotgate_tests::wat::built("probe-policy"),
            slotgate_tests::wat::built("probe-policy-v2"),
        ),
    )
    .unwrap();
    let (_up, gate) = keyed(&state, 8)
        .config_file(&config)
        .start_with(upstream())
        .await;
    let (id, secret) = create(
        &gate,
        &[
            "--tenant",
            "alice",
            "--team",
            "research",
            "--label",
            "laptop=alice-mbp",
        ],
    );
    let resp = chat_with(&gate, &[("x-api-key", &secret)]).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let want = json!({"tenant": "alice", "team": "research", "key_id": id,
                      "key_labels": {"laptop": "alice-mbp"}, "identity": "alice"});
    for contract in ["v1", "v2"] {
        let seen = resp
            .header(&format!("x-probe-caller-{contract}"))
            .unwrap_or_else(|| panic!("the {contract} probe answered"));
        assert_eq!(
            serde_json::from_str::<Value>(&seen).unwrap(),
            want,
            "what a {contract} policy reads"
        );
    }
    // A client cannot pass for another: its own header of the host's names is not passed on.
    let forged = chat_with(
        &gate,
        &[
            ("x-api-key", &secret),
            ("x-slotgate-key-labels", "{\"laptop\":\"forged\"}"),
            ("x-slotgate-tenant", "mallory"),
            ("x-slotgate-caller", "mallory"),
        ],
    )
    .await;
    for contract in ["v1", "v2"] {
        let seen: Value = serde_json::from_str(
            &forged
                .header(&format!("x-probe-caller-{contract}"))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(seen, want, "{contract}");
    }
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_from_one_peer_is_slowed_and_the_valid_client_is_not() {
    let state = unique_dir("keys-tarpit");
    let up = FakeUpstream::instant().api_key(UPSTREAM_KEY).start().await;
    let gate = keyed(&state, 4).upstream(&up).start().await;
    let (_, secret) = create(&gate, &["--tenant", "valid"]);
    // 32 flooders from the same peer (this test's uid) for three seconds, at the defaults: a burst
    // of 100, then 20 a second, the rest a second late.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut flood = Vec::new();
    for f in 0..32 {
        let client = gate.client();
        let stop = stop.clone();
        flood.push(tokio::spawn(async move {
            let mut refused = 0;
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let key = format!("sk-made-up-{f}-{n}");
                let r = client
                    .send_with(Method::POST, CHAT, &[("x-api-key", key.as_str())], chat())
                    .await;
                assert_eq!(r.status, 401, "{}", r.body);
                refused += 1;
            }
            refused
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The valid client meanwhile, from the same peer: served, none of its requests held back.
    for _ in 0..8 {
        let began = std::time::Instant::now();
        let r = chat_with(&gate, &[("x-api-key", &secret)]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(
            began.elapsed() < Duration::from_secs(1),
            "a served request is never held back: {:?}",
            began.elapsed()
        );
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut refused = 0;
    for f in flood {
        refused += f.await.unwrap();
    }
    // Three seconds: the burst, 20 a second, and each connection's one-a-second; without the
    // tarpit the same flood is refused tens of thousands of times.
    assert!(
        (100..=100 + 3 * 20 + 4 * 32 + 32).contains(&refused),
        "{refused} refusals in three seconds"
    );
    let delayed = gate
        .metric("slotgate_refusals_delayed_total", &[])
        .await
        .unwrap_or(0.0);
    assert!(delayed >= 32.0, "{delayed} refusals delayed");
    assert_eq!(up.count(), 8, "only the valid client reached llama-server");
    gate.assert_idle().await;
}
