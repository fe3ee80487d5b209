//! The token-budget example policy from a client's side: it settles a request's estimate just after
//! the response has ended, so the next request may be refused until that refund has landed.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::client::{Client, Response};
use crate::errors::assert_error;
use crate::request::CHAT;

/// How long a refund may take to land once the response has ended.
const REFUND_TIMEOUT: Duration = Duration::from_secs(5);

/// Posts chat `body` again every 50 ms while token-budget refuses it (429 `policy_denied`), and
/// returns the first other answer. Panics after 5 s, naming `what` has not happened.
pub async fn send_until_refunded(client: &Client, body: &Value, what: &str) -> Response {
    let deadline = Instant::now() + REFUND_TIMEOUT;
    let mut refused = 0;
    loop {
        let resp = client.post_json(CHAT, body).await;
        if resp.status != 429 {
            return resp;
        }
        assert_error(&resp, 429, "policy_denied");
        refused += 1;
        assert!(
            Instant::now() < deadline,
            "{what} within {REFUND_TIMEOUT:?} ({refused} refusals): {}",
            resp.body
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
