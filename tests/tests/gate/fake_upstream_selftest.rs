//! Self-test of the fake llama-server, talking to it directly: the counters the other tests trust
//! (`max_concurrency`, `current`, `cancelled`, usage totals, loading) must be honest.

use std::time::Duration;

use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_covers_streamed_bodies() {
    let up = FakeUpstream::instant().start().await;
    let client = Client::unix(up.socket_path());
    let a = client.stream_chat(&Req::chat("a").chunks(5, ms(60))).await;
    let b = client.stream_chat(&Req::chat("b").chunks(5, ms(60))).await;
    assert_eq!(
        up.current(),
        2,
        "both streams are in progress once their heads arrived"
    );
    let (a, b) = tokio::join!(
        a.read_sse(Duration::from_secs(3)),
        b.read_sse(Duration::from_secs(3))
    );
    assert!(a.complete() && b.complete());
    assert_eq!(up.max_concurrency(), 2);
    eventually(Duration::from_secs(1), "streams finished", || async {
        (up.current() == 0).then_some(())
    })
    .await;
    assert_eq!(up.cancelled(), 0);
    assert_eq!(up.usage_totals(), (20, 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_stream_counts_as_cancelled() {
    let up = FakeUpstream::instant().start().await;
    let client = Client::unix(up.socket_path());
    let mut s = client.stream_chat(&Req::chat("a").chunks(50, ms(50))).await;
    s.first_event(Duration::from_secs(1)).await;
    drop(s);
    eventually(Duration::from_secs(2), "cancelled == 1", || async {
        (up.cancelled() == 1).then_some(())
    })
    .await;
    eventually(Duration::from_secs(1), "current == 0", || async {
        (up.current() == 0).then_some(())
    })
    .await;
    assert_eq!(
        up.usage_totals(),
        (0, 0),
        "an abandoned stream reports no usage"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_non_stream_request_leaves_current() {
    let up = FakeUpstream::instant().start().await;
    let client = Client::unix(up.socket_path());
    let pending = spawn_post(&client, CHAT, &Req::chat("slow").delay(ms(3000)));
    eventually(Duration::from_secs(1), "request arrived", || async {
        (up.current() == 1).then_some(())
    })
    .await;
    pending.abort();
    eventually(
        Duration::from_secs(1),
        "current == 0 after the client left",
        || async { (up.current() == 0).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loading_answers_503_everywhere_then_serves() {
    let up = FakeUpstream::loading_then_ready(ms(300)).start().await;
    let client = Client::unix(up.socket_path());
    let health = client.get("/health").await;
    assert_eq!(health.status, 503);
    assert_eq!(health.json()["error"]["message"], "Loading model");
    assert_eq!(client.post_chat(&Req::chat("x")).await.status, 503);
    assert_eq!(up.rejected_while_loading(), 1);
    assert_eq!(up.count(), 0);
    tokio::time::sleep_until(up.ready_at().into()).await;
    assert_eq!(client.get("/health").await.status, 200);
    let resp = client.post_chat(&Req::chat("x")).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["usage"]["prompt_tokens"], 10);
    assert_eq!(up.tags(), ["x"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_breaks_the_body() {
    let up = FakeUpstream::crash_mid_stream(2).start().await;
    let client = Client::unix(up.socket_path());
    let sse = client
        .stream_chat(&Req::chat("c").stream())
        .await
        .read_sse(Duration::from_secs(3))
        .await;
    assert_eq!(sse.data.len(), 2);
    assert!(!sse.done && sse.error.is_some(), "{sse:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_request_per_connection_closes_after_a_complete_answer() {
    let up = FakeUpstream::instant()
        .one_request_per_connection()
        .start()
        .await;
    let client = Client::unix(up.socket_path());
    for i in 0..3 {
        // Fresh connections always work, and the answer is complete before the close.
        let resp = client.post_chat(&Req::chat(&format!("f{i}"))).await;
        assert_eq!(resp.status, 200);
        assert_eq!(resp.tag(), Some(format!("f{i}")));
    }
    let sse = client
        .stream_chat(&Req::chat("s").chunks(3, ms(5)))
        .await
        .read_sse(Duration::from_secs(2))
        .await;
    assert!(sse.complete(), "{sse:?}");

    let mut conn = client.connect().await.unwrap();
    assert_eq!(
        conn.post_json(CHAT, &Req::chat("first").json())
            .await
            .unwrap()
            .status,
        200
    );
    tokio::time::sleep(ms(50)).await;
    assert!(
        conn.post_json(CHAT, &Req::chat("second").json())
            .await
            .is_err(),
        "the connection was closed"
    );
    assert!(!up.saw_tag("second"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_are_counted_once_each() {
    let up = FakeUpstream::instant().start().await;
    let client = Client::unix(up.socket_path());
    let mut conn = client.connect().await.unwrap();
    for tag in ["a", "b"] {
        let resp = conn.post_json(CHAT, &Req::chat(tag).json()).await.unwrap();
        assert_eq!(resp.status, 200);
    }
    assert_eq!(client.get("/health").await.status, 200);
    assert_eq!(
        up.connections(),
        2,
        "two requests on one kept-alive connection, one on another"
    );
    assert_eq!(up.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timings_only_usage_looks_like_llama_server_without_include_usage() {
    let up = FakeUpstream::instant().start().await;
    let client = Client::unix(up.socket_path());
    let req = Req::chat("t")
        .prompt_tokens(30)
        .completion_tokens(4)
        .usage_in_timings_only(25);
    let sse = client
        .stream(CHAT, &req.clone().chunks(2, ms(5)).json())
        .await
        .read_sse(Duration::from_secs(3))
        .await;
    assert!(sse.complete(), "{sse:?}");
    assert!(
        !sse.raw.contains("\"usage\""),
        "no usage anywhere: {}",
        sse.raw
    );
    let last: serde_json::Value = serde_json::from_str(sse.data.last().unwrap()).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    let t = &last["timings"];
    assert_eq!(
        (&t["cache_n"], &t["prompt_n"], &t["predicted_n"]),
        (&25.into(), &5.into(), &4.into())
    );

    let whole = client.post_json(CHAT, &req.json()).await;
    assert_eq!(whole.status, 200);
    let body = whole.json();
    assert!(body.get("usage").is_none(), "{body}");
    assert_eq!(body["timings"]["prompt_n"], 5);
    assert_eq!(up.usage_totals(), (60, 8));
}
