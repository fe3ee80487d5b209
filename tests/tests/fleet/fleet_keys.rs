//! A fleet shares the keys slotgate issues (docs/keys.md#a-fleet-shares-its-keys): under
//! `--client-auth keys` with the redis backend, a key made on one sidecar is served by the others,
//! and its revocation reaches them within a second. Each sidecar keeps what it read in its own
//! state store, so a sidecar killed and started again while the store is down still refuses the
//! revoked key and serves the others.

use std::path::Path;
use std::time::{Duration, Instant};

use http::Method;
use serde_json::{json, Value};
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::redis::{wait_connected, RunningRedis};
use slotgate_tests::request::CHAT;
use slotgate_tests::wait::{eventually, unique_dir};

const UPSTREAM_KEY: &str = "sk-fleet-llama-key-0001";
const ADMIN: &str = "fleet-keys-admin-token-0123";

/// A sidecar of the fleet under `--client-auth keys`, its own state in `dir`.
fn keyed(redis: &RunningRedis, dir: &Path) -> Gate {
    std::fs::create_dir_all(dir).unwrap();
    let key_file = dir.join("upstream-key");
    std::fs::write(&key_file, UPSTREAM_KEY).unwrap();
    redis
        .backend_for(Gate::one_slot(8))
        .opt("--client-auth", "keys")
        .opt("--state-dir", dir.join("state").display())
        .opt("--upstream-api-key-file", key_file.display())
        .admin_token(ADMIN)
}

fn cli(gate: &RunningGate, args: &[&str]) -> Value {
    let (ok, out, err) = gate.admin_cli(args);
    assert!(ok, "{args:?}: {out}{err}");
    serde_json::from_str(out.trim()).unwrap_or(Value::Null)
}

async fn status(gate: &RunningGate, secret: &str) -> u16 {
    let body =
        json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    gate.client()
        .send_with(
            Method::POST,
            CHAT,
            &[("x-api-key", secret)],
            body.to_string(),
        )
        .await
        .status
        .as_u16()
}

/// How long until `gate` answers `secret` with `want`, polled every 20 ms for at most 10 s.
async fn until(gate: &RunningGate, secret: &str, want: u16) -> Duration {
    let began = Instant::now();
    eventually(
        Duration::from_secs(10),
        "the fleet's keys reach the sidecar",
        || async { (status(gate, secret).await == want).then_some(()) },
    )
    .await;
    began.elapsed()
}

slotgate_tests::on_each_store! {
async fn keys_made_and_revoked_on_one_sidecar_reach_the_others_within_a_second(store: Store) {
    let mut redis = RunningRedis::start_on(store);
    let base = unique_dir("fleet-keys");
    let up = FakeUpstream::instant().api_key(UPSTREAM_KEY).start().await;
    let g1 = keyed(&redis, &base.join("one")).upstream(&up).start().await;
    let g2 = keyed(&redis, &base.join("two")).upstream(&up).start().await;
    wait_connected(&g1).await;
    wait_connected(&g2).await;

    let alice = cli(&g1, &["key", "create", "--tenant", "alice", "--json"]);
    let (alice_id, alice) = (alice["id"].as_str().unwrap().to_owned(), alice["secret"].as_str().unwrap().to_owned());
    let bob = cli(&g2, &["key", "create", "--tenant", "bob", "--json"]);
    let bob = bob["secret"].as_str().unwrap().to_owned();
    let reached = until(&g2, &alice, 200).await;
    println!("a key made on one sidecar served by the other after {reached:?}");
    until(&g1, &bob, 200).await;

    // Revoked on one: refused by the other within a second.
    cli(&g1, &["key", "revoke", &alice_id, "--json"]);
    let revoked = until(&g2, &alice, 401).await;
    println!("a revocation reached the other sidecar after {revoked:?}");
    assert!(revoked < Duration::from_secs(1), "the revocation took {revoked:?}");
    let listed = cli(&g2, &["key", "list", "--json"]);
    assert_eq!(listed["count"], 2, "{listed}");

    // The store goes away; a sidecar killed and started again keeps what it read.
    redis.kill9();
    g2.signal("KILL");
    drop(g2);
    let g2 = keyed(&redis, &base.join("two")).upstream(&up).start().await;
    assert_eq!(status(&g2, &alice).await, 401, "the revocation outlived the store and a SIGKILL");
    assert_eq!(status(&g2, &bob).await, 200);
    g1.assert_idle().await;
    g2.assert_idle().await;
}
}
