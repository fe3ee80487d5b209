//! The caller's identity is the host's: slotgate names the caller once per request and every policy
//! reads that name, whatever its language and contract. tenant-priority with `deny_unknown` says
//! whom it refused (`<identity> is not a known tenant`), in Rust as a v1 module and as a v2
//! component and in TypeScript (v2); the probe policy echoes its `identity()` as a v1 module and as
//! a v2 component in one chain. Each hears `uid:<n>` of the Unix peer, `sha256:<hex>` of a TCP
//! caller's key, and `anonymous` for a TCP caller without one.
//!
//! Needs the Rust policies (`scripts/build-policies.sh`) and the TypeScript one
//! (`scripts/build-policies-ts.sh`).

use slotgate_tests::client::{Client, Response};
use slotgate_tests::fake_upstream::RunningUpstream;
use slotgate_tests::gate::{free_port, hash_key, Gate, RunningGate};
use slotgate_tests::request::{Req, CHAT};
use slotgate_tests::wait::{current_uid, unique_dir};
use slotgate_tests::wat;

const KEY: &str = "k-identity";

/// Knows one tenant, a uid no test runs as, and refuses everyone else by name.
const DENY_UNKNOWN: &str =
    r#"{ deny_unknown = true, tenants = { a = { uids = [4000000000], priority = 0 } } }"#;

fn cache_dir() -> String {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    format!("{home}/.cache/slotgate/policy-cache")
}

/// The three callers, each by the listener and key it comes with, and the identity the host names.
fn callers(unix: &Client, tcp: &Client) -> [(Client, Option<String>, String); 3] {
    let uid = current_uid();
    [
        (unix.clone(), None, format!("uid:{uid}")),
        (tcp.clone(), Some(KEY.to_owned()), hash_key(KEY)),
        (tcp.clone(), None, "anonymous".to_owned()),
    ]
}

async fn send(client: &Client, key: Option<&str>, tag: &str) -> Response {
    let headers: Vec<(&str, String)> = key
        .map(|k| ("authorization", format!("Bearer {k}")))
        .into_iter()
        .collect();
    client
        .post_json_with_headers(CHAT, &Req::chat(tag).json(), &headers)
        .await
}

/// `gate` started on a Unix socket and a TCP port, with a client for each.
async fn gate_on(gate: Gate) -> (RunningUpstream, RunningGate, Client, Client) {
    let dir = unique_dir("caller-identity");
    let socket = dir.join("slotgate.sock");
    let port = free_port();
    let (up, gate) = gate
        .listen_unix(&socket)
        .listen(format!("tcp:127.0.0.1:{port}"))
        .env("SLOTGATE_POLICY_CACHE_DIR", &cache_dir())
        .start_instant()
        .await;
    let unix = Client::unix(&socket);
    let tcp = Client::tcp(([127, 0, 0, 1], port).into());
    (up, gate, unix, tcp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_policy_is_refused_by_the_name_the_host_gave_the_caller() {
    for name in [
        "tenant-priority",
        "tenant-priority-v2",
        "tenant-priority-ts",
    ] {
        let policy = wat::built(name);
        let gate = Gate::one_slot(4).policies(&[(&policy, Some(DENY_UNKNOWN))]);
        let (_up, _gate, unix, tcp) = gate_on(gate).await;
        for (i, (client, key, identity)) in callers(&unix, &tcp).into_iter().enumerate() {
            let resp = send(&client, key.as_deref(), &format!("{name}-{i}")).await;
            assert_eq!(resp.status, 403, "{name}, {identity}: {}", resp.body);
            let said = format!("{identity} is not a known tenant");
            assert!(resp.body.contains(&said), "{name}: {said} in {}", resp.body);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_v1_module_and_a_v2_component_read_the_identity_the_host_gave() {
    let dir = unique_dir("caller-identity-probes");
    let config = dir.join("slotgate.toml");
    std::fs::write(
        &config,
        format!(
            "[[policy]]\nname = \"probe-v1\"\npath = {:?}\n\n[[policy]]\nname = \"probe-v2\"\npath = {:?}\n",
            wat::built("probe-policy"),
            wat::built("probe-policy-v2"),
        ),
    )
    .unwrap();
    let (_up, _gate, unix, tcp) = gate_on(Gate::one_slot(4).config_file(&config)).await;
    for (i, (client, key, identity)) in callers(&unix, &tcp).into_iter().enumerate() {
        let resp = send(&client, key.as_deref(), &format!("probe-{i}")).await;
        assert_eq!(resp.status, 200, "{identity}: {}", resp.body);
        for contract in ["v1", "v2"] {
            let seen = resp
                .header(&format!("x-probe-caller-{contract}"))
                .unwrap_or_else(|| panic!("the {contract} probe answered"));
            let seen: serde_json::Value = serde_json::from_str(&seen).unwrap();
            assert_eq!(seen["identity"], identity.as_str(), "{contract}: {seen}");
        }
    }
}
