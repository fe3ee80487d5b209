//! `on_complete`: after each response the policies learn what really happened, so the token-budget
//! example refunds its estimate from the actual usage. Without the refund its bucket (no refill)
//! could never admit a second request.

use std::time::{Duration, Instant};

use slotgate_tests::errors::assert_error;
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::Gate;
use slotgate_tests::request::{Req, CHAT};
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_budget_is_refunded_from_actual_usage() {
    let dir = unique_dir("policy-complete");
    let config = dir.join("slotgate.toml");
    std::fs::write(
        &config,
        format!(
            "[[policy]]\npath = \"{}\"\nsettings = {{ capacity = 1000, refill_per_second = 0 }}\n",
            wat::built("token-budget").display()
        ),
    )
    .unwrap();
    let (up, gate) = Gate::new()
        .slots(1)
        .arg("--config")
        .arg(config.to_str().unwrap())
        .start_with(FakeUpstream::instant())
        .await;
    let client = gate.client();
    // Charged about 600 of the 1000 up front; the answer used 15 (10 prompt + 5 completion).
    let big = Req::chat("first")
        .set("max_tokens", 600)
        .prompt_tokens(10)
        .completion_tokens(5);
    let resp = client.post_json(CHAT, &big.json()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);

    // The refund runs just after the response ends; until it lands the bucket holds ~400 and a second
    // 600-token request is refused. It must get in once the estimate has been settled.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut refused = 0;
    loop {
        let resp = client
            .post_json(CHAT, &Req::chat("second").set("max_tokens", 600).json())
            .await;
        if resp.status == 200 {
            break;
        }
        assert_error(&resp, 429, "policy_denied");
        refused += 1;
        assert!(
            Instant::now() < deadline,
            "never refunded: {refused} refusals; {}",
            resp.body
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        up.tags(),
        ["first", "second"],
        "refused requests are never forwarded"
    );
    gate.assert_settled(&up, 1).await;
}

/// A request the budget allowed but a later policy denied never reached llama-server: the budget's
/// `on_complete` still runs (outcome `policy_denied`, no usage) and gives the whole estimate back.
/// Without it, each such denial would burn 600 of the tenant's 1000 tokens for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_later_policys_deny_gives_the_budget_back() {
    let dir = unique_dir("policy-complete-deny");
    let deny = br#"{"verdict":"deny","status":403,"message":"blocked model"}"#;
    let guard = wat::hostile(
        &dir,
        "guard",
        &wat::output(1024, deny.len() as u32),
        &wat::data(1024, deny),
    );
    let config = dir.join("slotgate.toml");
    std::fs::write(
        &config,
        format!(
            "[[policy]]\npath = \"{}\"\nsettings = {{ capacity = 1000, refill_per_second = 0 }}\n\
             [[policy]]\npath = \"{}\"\n",
            wat::built("token-budget").display(),
            guard.display()
        ),
    )
    .unwrap();
    let (up, gate) = Gate::new()
        .slots(1)
        .arg("--config")
        .arg(config.to_str().unwrap())
        .start_with(FakeUpstream::instant())
        .await;
    let client = gate.client();
    // Each blocked request is charged ~600 of the 1000 by token-budget, then denied by the guard.
    // Its refund lands just after the response; until then the next one gets token-budget's 429.
    // Were the estimate not given back, every request after the first would get 429 for good.
    let mut refused = 0;
    for i in 0..3 {
        let blocked = Req::chat(&format!("blocked-{i}"))
            .set("model", wat::MARKER)
            .set("max_tokens", 600);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let resp = client.post_json(CHAT, &blocked.json()).await;
            if resp.status == 403 {
                assert_error(&resp, 403, "policy_denied");
                assert!(resp.body.contains("blocked model"), "{}", resp.body);
                break;
            }
            assert_error(&resp, 429, "policy_denied");
            refused += 1;
            assert!(
                Instant::now() < deadline,
                "the estimate never came back ({refused} refusals): {}",
                resp.body
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // The last refund may still be on its way.
    let deadline = Instant::now() + Duration::from_secs(5);
    let resp = loop {
        let resp = client
            .post_json(CHAT, &Req::chat("served").set("max_tokens", 600).json())
            .await;
        if resp.status == 200 || Instant::now() >= deadline {
            break resp;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(up.tags(), ["served"], "denied requests are never forwarded");
    gate.assert_settled(&up, 1).await;
}
