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
