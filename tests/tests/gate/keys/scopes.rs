//! What a key and its team may reach: the networks its callers come from (`--allow-from` for the
//! listeners, a key's own `--allow-from`), refused with 403 in the API's shape before anything is
//! counted; and a team's cap on its requests in service (`[teams."NAME"]`), which holds back every
//! key of the team and nobody else.

use std::time::Duration;

use http::Method;
use serde_json::json;
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::free_port;
use slotgate_tests::request::CHAT;
use slotgate_tests::wait::unique_dir;

use super::{chat, create, keyed, UPSTREAM_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_from_outside_their_networks_are_refused_before_anything() {
    let state = unique_dir("keys-nets");
    let sock = state.join("c.sock");
    let up = FakeUpstream::instant().api_key(UPSTREAM_KEY).start().await;
    // The listeners take 10.0.0.0/8 only: a TCP caller from 127.0.0.1 is outside, a Unix one local.
    let gate = keyed(&state, 8)
        .listen(format!("tcp:127.0.0.1:{}", free_port()))
        .listen_unix(&sock)
        .opt("--allow-from", "10.0.0.0/8")
        .upstream(&up)
        .start()
        .await;
    let (_, secret) = create(&gate, &["--tenant", "alice"]);
    let [tcp, unix] = &gate.clients()[..] else {
        panic!("two listeners")
    };
    let refused = tcp
        .send_with(Method::POST, CHAT, &[("x-api-key", &secret)], chat())
        .await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    let v = refused.json();
    assert_eq!(v["error"]["code"], "source_not_allowed", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("127.0.0.1"),
        "{v}"
    );
    // The Messages API in Anthropic's shape; no key at all is refused for its network first.
    let messages = tcp
        .send_with(
            Method::POST,
            "/v1/messages",
            &[],
            json!({"model": "fake", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
                .to_string(),
        )
        .await;
    assert_eq!(messages.status, 403, "{}", messages.body);
    assert_eq!(messages.json()["error"]["type"], "permission_error");
    let me = tcp
        .get_with("/v1/slotgate/me", &[("x-api-key", &secret)])
        .await;
    assert_eq!(me.status, 403, "{}", me.body);
    let ok = unix
        .send_with(Method::POST, CHAT, &[("x-api-key", &secret)], chat())
        .await;
    assert_eq!(ok.status, 200, "a Unix peer is local: {}", ok.body);
    assert_eq!(up.count(), 1, "nothing from outside reached llama-server");
    gate.wait_metric(
        "slotgate_callers_refused_total",
        &[("reason", "source_network")],
        3.0,
    )
    .await;
    gate.assert_idle().await;
    drop(gate);

    // The listeners take loopback; each key narrows it further.
    let gate = keyed(&state, 8)
        .listen(format!("tcp:127.0.0.1:{}", free_port()))
        .opt("--allow-from", "127.0.0.0/8,::1")
        .upstream(&up)
        .start()
        .await;
    let (_, near) = create(&gate, &["--tenant", "bob", "--allow-from", "127.0.0.1"]);
    let (_, far) = create(&gate, &["--tenant", "carol", "--allow-from", "10.0.0.0/8"]);
    let send = |secret: String| {
        let client = gate.client();
        async move {
            client
                .send_with(Method::POST, CHAT, &[("x-api-key", &secret)], chat())
                .await
        }
    };
    assert_eq!(send(near).await.status, 200);
    let r = send(far).await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("for this API key"), "{}", r.body);
    let (ok, _, err) = super::cli(
        &gate,
        &[
            "key",
            "create",
            "--tenant",
            "x",
            "--allow-from",
            "10.0.0.0/99",
        ],
    );
    assert!(!ok && err.contains("network"), "{err}");
    assert_eq!(up.count(), 2);
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_team_cap_holds_back_every_key_of_the_team_and_nobody_else() {
    let state = unique_dir("keys-team");
    let config = state.join("teams.toml");
    std::fs::write(&config, "[teams.research]\nmax-in-service = 1\n").unwrap();
    let up = FakeUpstream::instant()
        .api_key(UPSTREAM_KEY)
        .delay(Duration::from_millis(400))
        .start()
        .await;
    let gate = keyed(&state, 16)
        .slots(4)
        .config_file(&config)
        .upstream(&up)
        .start()
        .await;
    let (_, alice) = create(&gate, &["--tenant", "alice", "--team", "research"]);
    let (_, bob) = create(&gate, &["--tenant", "bob", "--team", "research"]);
    let (_, carol) = create(&gate, &["--tenant", "carol"]);
    // Four of the team's and two of carol's at once, on four slots: the team runs one at a time,
    // carol's two beside it.
    let mut all = Vec::new();
    for secret in [&alice, &bob, &alice, &bob, &carol, &carol] {
        let client = gate.client();
        let secret = secret.clone();
        all.push(tokio::spawn(async move {
            client
                .send_with(Method::POST, CHAT, &[("x-api-key", &secret)], chat())
                .await
                .status
        }));
    }
    for a in all {
        assert_eq!(a.await.unwrap(), 200);
    }
    assert_eq!(
        up.max_concurrency(),
        3,
        "one of the team's and carol's two at most at once"
    );
    gate.assert_idle().await;
}
