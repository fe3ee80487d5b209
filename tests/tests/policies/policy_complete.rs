//! `on_complete`: after each response the policies learn what really happened, so the token-budget
//! example refunds its estimate from the actual usage. Without the refund its bucket (no refill)
//! could never admit a second request.

use std::time::Duration;

use slotgate_tests::budget::send_until_refunded;
use slotgate_tests::errors::assert_error_says;
use slotgate_tests::gate::Gate;
use slotgate_tests::request::{spawn_post, Req, CHAT};
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

/// token-budget's settings here: 1000 tokens, never refilled.
const BUDGET: Option<&str> = Some("{ capacity = 1000, refill_per_second = 0 }");

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_budget_is_refunded_from_actual_usage() {
    let (up, gate) = Gate::new()
        .slots(1)
        .policies(&[(&wat::built("token-budget"), BUDGET)])
        .start_instant()
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
    let second = Req::chat("second").set("max_tokens", 600).json();
    let resp = send_until_refunded(&client, &second, "never refunded").await;
    assert_eq!(resp.status, 200, "{}", resp.body);
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
    let guard = wat::denying(&dir, "guard", "blocked model");
    let (up, gate) = Gate::new()
        .slots(1)
        .policies(&[(&wat::built("token-budget"), BUDGET), (&guard, None)])
        .start_instant()
        .await;
    let client = gate.client();
    // Each blocked request is charged ~600 of the 1000 by token-budget, then denied by the guard.
    // Its refund lands just after the response; until then the next one gets token-budget's 429.
    // Were the estimate not given back, every request after the first would get 429 for good.
    for i in 0..3 {
        let blocked = Req::chat(&format!("blocked-{i}"))
            .set("model", wat::MARKER)
            .set("max_tokens", 600);
        let resp =
            send_until_refunded(&client, &blocked.json(), "the estimate never came back").await;
        assert_error_says(&resp, 403, "policy_denied", "blocked model");
    }
    // The last refund may still be on its way.
    let served = Req::chat("served").set("max_tokens", 600).json();
    let resp = send_until_refunded(&client, &served, "the last estimate never came back").await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(up.tags(), ["served"], "denied requests are never forwarded");
    gate.assert_settled(&up, 1).await;
}

/// A client that leaves while its request is being evaluated cancels nothing: the evaluation runs
/// to its end, and a policy that allowed the request (token-budget, which took ~600 of its 1000
/// tokens) hears that it was never served (`on_complete`, outcome `client_gone`) and gives the
/// tokens back. Were the evaluation cancelled with the request, or its result dropped, the budget
/// would stay spent and the next 600-token request would get 429 for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_leaves_during_the_evaluation_gets_the_budget_back() {
    let dir = unique_dir("policy-complete-leave");
    // Spins on the marked request until its 1.5 s deadline, then fails open.
    let slow = wat::hostile(&dir, "slow", "(loop $spin (br $spin))", "");
    let config = dir.join("slotgate.toml");
    std::fs::write(
        &config,
        format!(
            "[[policy]]\npath = \"{}\"\nsettings = {}\n\n[[policy]]\npath = \"{}\"\non-error = \"allow\"\nfuel = 100000000000\ndeadline = \"1500ms\"\n",
            wat::built("token-budget").display(),
            BUDGET.unwrap(),
            slow.display()
        ),
    )
    .unwrap();
    let (up, gate) = Gate::new()
        .slots(1)
        .config_file(&config)
        .start_instant()
        .await;
    let client = gate.client();
    let leaver = spawn_post(
        &client,
        CHAT,
        &Req::chat("left")
            .set("model", wat::MARKER)
            .set("max_tokens", 600),
    );
    // Well inside the slow policy's evaluation, after token-budget has taken its share.
    tokio::time::sleep(Duration::from_millis(300)).await;
    leaver.abort();
    let _ = leaver.await;
    gate.wait_outcome("client_gone", 1).await;
    let served = Req::chat("served").set("max_tokens", 600).json();
    let resp = send_until_refunded(
        &client,
        &served,
        "the departed client's tokens never came back",
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        up.tags(),
        ["served"],
        "the departed request was never forwarded"
    );
    gate.assert_settled(&up, 1).await;
}
