//! Passthrough endpoints (`/tokenize`, `/v1/models`, `/props`, ...) are forwarded without taking a slot.

use std::time::{Duration, Instant};

use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn passthroughs_answer_while_the_only_slot_is_busy() {
    let (up, gate) = Gate::one_slot(0).start_instant().await;
    let client = gate.client();

    let hold = gate.hold_slot(&Req::chat("hold").delay(ms(1000))).await;

    let t0 = Instant::now();
    for path in ["/v1/models", "/models", "/props"] {
        let resp = client.get(path).await;
        assert_eq!(resp.status, 200, "GET {path}: {}", resp.body);
    }
    for path in ["/tokenize", "/detokenize", "/apply-template"] {
        let resp = client
            .post_json(path, &serde_json::json!({"content": "hi", "tokens": [1]}))
            .await;
        assert_eq!(resp.status, 200, "POST {path}: {}", resp.body);
    }
    assert!(
        t0.elapsed() < Duration::from_millis(800),
        "passthroughs waited for the slot ({:?})",
        t0.elapsed()
    );
    assert_eq!(
        up.passthrough_seen(),
        [
            "/v1/models",
            "/models",
            "/props",
            "/tokenize",
            "/detokenize",
            "/apply-template"
        ]
    );

    let (held, _) = hold.await.unwrap();
    assert_eq!(held.status, 200);
    gate.assert_settled(&up, 1).await;
}
