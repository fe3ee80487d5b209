//! Calendar quotas give the same answers on one sidecar keeping them on disk (`state.dir`) and on
//! two sidecars sharing them on Redis or Valkey: the same scripted scenario (two tenants, a quota
//! of three requests a day, spent, refused, topped up by an operator) is run on both and every
//! answer compared, status and allowance.

use std::time::Duration;

use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::redis::{wait_connected, RunningRedis};
use slotgate_tests::request::{Req, CHAT};
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

const THREE_A_DAY: &str = "{ period = \"day\", requests = 3 }";
const TOKEN: &str = "fleet-quota-admin-token-0123";

/// What one step answered: its status and the requests it says are left.
type Answer = (u16, Option<String>);

/// A step: send as `tenant` to sidecar `on`, or have an operator top `tenant` up by one on `on`.
enum Step {
    Ask { on: usize, tenant: &'static str },
    TopUp { on: usize, tenant: &'static str },
}

const SCRIPT: &[Step] = &[
    Step::Ask { on: 0, tenant: "a" },
    Step::Ask { on: 1, tenant: "a" },
    Step::Ask { on: 0, tenant: "b" },
    Step::Ask { on: 1, tenant: "a" },
    Step::Ask { on: 0, tenant: "a" },
    Step::Ask { on: 1, tenant: "a" },
    Step::Ask { on: 1, tenant: "b" },
    Step::TopUp { on: 0, tenant: "a" },
    Step::Ask { on: 1, tenant: "a" },
    Step::Ask { on: 0, tenant: "a" },
];

/// Runs the script on `gates` (a step's `on` taken modulo their number); a pause after each step
/// lets a fleet sidecar settle its lease with the store, as a real client's think time would.
async fn run(gates: &[&RunningGate]) -> Vec<Answer> {
    let mut answers = Vec::new();
    for (i, step) in SCRIPT.iter().enumerate() {
        match step {
            Step::Ask { on, tenant } => {
                let gate = gates[on % gates.len()];
                let resp = gate
                    .client()
                    .post_json_with_headers(
                        CHAT,
                        &Req::chat(&format!("{tenant}-{i}")).json(),
                        &[("authorization", format!("Bearer key-{tenant}"))],
                    )
                    .await;
                answers.push((
                    resp.status.as_u16(),
                    resp.header("x-ratelimit-remaining-requests"),
                ));
            }
            Step::TopUp { on, tenant } => {
                let gate = gates[on % gates.len()];
                let key = format!(
                    "requests:{}",
                    slotgate_tests::gate::hash_key(&format!("key-{tenant}"))
                );
                let body = serde_json::json!({"policy": "quota", "key": key, "period": "day", "amount": 1});
                let resp = gate
                    .admin()
                    .send_with(http::Method::POST, "/quotas/top-up", &[], body.to_string())
                    .await;
                answers.push((resp.status.as_u16(), None));
            }
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    answers
}

fn quota_gate() -> Gate {
    Gate::new()
        .admin_token(TOKEN)
        .policies(&[(&wat::built("quota"), Some(THREE_A_DAY))])
}

slotgate_tests::on_each_store! {
async fn one_sidecar_on_disk_and_two_on_a_shared_store_answer_alike(store: Store) {
    let dir = unique_dir("fleet-quota").join("state");
    let (up, alone) = quota_gate()
        .opt("--state-dir", dir.to_str().unwrap())
        .start_instant()
        .await;
    let embedded = run(&[&alone]).await;
    alone.assert_settled(&up, 1).await;

    let redis = RunningRedis::start_on(store);
    let (up1, g1) = redis.backend_for(quota_gate()).start_instant().await;
    let (up2, g2) = redis.backend_for(quota_gate()).start_instant().await;
    wait_connected(&g1).await;
    wait_connected(&g2).await;
    let fleet = run(&[&g1, &g2]).await;

    let ok = |left: &str| (200, Some(left.to_owned()));
    assert_eq!(
        embedded,
        [
            ok("2"),
            ok("1"),
            ok("2"),
            ok("0"),
            (429, Some("0".into())),
            (429, Some("0".into())),
            ok("1"),
            (200, None),
            ok("0"),
            (429, Some("0".into())),
        ],
        "the script on one sidecar"
    );
    assert_eq!(fleet, embedded, "two sidecars on a shared store answer as one does");
    // Each sidecar shows the fleet's level of the quotas it has used.
    let key = format!("requests:{}", slotgate_tests::gate::hash_key("key-a"));
    for gate in [&g1, &g2] {
        let list: serde_json::Value = serde_json::from_str(&gate.admin_get("/quotas").await.body).unwrap();
        let a = list["quotas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["key"] == key.as_str())
            .unwrap_or_else(|| panic!("{list}"))
            .clone();
        assert_eq!((a["left"].as_f64(), a["limit"].as_f64()), (Some(0.0), Some(3.0)), "{list}");
        let s = gate.status().await;
        assert!(s["state"]["quotas"]["count"].as_u64() >= Some(2), "{s}");
    }

    // An operator raises a's limit to 5 on one sidecar: the fleet's store holds it, so the other
    // serves a again at once, and reports the new limit once it has read it (every heartbeat).
    let body = serde_json::json!({"policy": "quota", "key": key, "period": "day", "limit": 5});
    let resp = g1
        .admin()
        .send_with(http::Method::POST, "/quotas/set", &[], body.to_string())
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let set: serde_json::Value = serde_json::from_str(&resp.body).unwrap();
    assert_eq!(set["left"], 2.0, "3 used of 5: {set}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ask = |gate: &RunningGate| {
        let client = gate.client();
        async move {
            client
                .post_json_with_headers(
                    CHAT,
                    &Req::chat("after-set").json(),
                    &[("authorization", "Bearer key-a".to_owned())],
                )
                .await
        }
    };
    let resp = ask(&g2).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.header("x-ratelimit-limit-requests").as_deref(), Some("5"));
    assert_eq!(resp.header("x-ratelimit-remaining-requests").as_deref(), Some("1"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(ask(&g1).await.status, 200);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(ask(&g2).await.status, 429, "5 of 5 used across the fleet");
    for gate in [&g1, &g2] {
        let list: serde_json::Value = serde_json::from_str(&gate.admin_get("/quotas").await.body).unwrap();
        let a = list["quotas"].as_array().unwrap().iter().find(|q| q["key"] == key.as_str()).unwrap().clone();
        assert_eq!((a["limit"].as_f64(), a["limit_set_by"].as_str()), (Some(5.0), Some("operator")), "{list}");
    }
    g1.assert_settled(&up1, 1).await;
    g2.assert_settled(&up2, 1).await;
}
}
