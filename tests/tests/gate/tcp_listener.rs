//! TCP listener: `--listen tcp:HOST:PORT` serves the same API as the Unix socket, alone or alongside it.

use slotgate_tests::gate::free_port;
use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_over_tcp_works() {
    let (up, gate) = Gate::new()
        .listen(format!("tcp:127.0.0.1:{}", free_port()))
        .start_instant()
        .await;
    let resp = gate.client().post_chat(&Req::chat("tcp")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.tag().as_deref(), Some("tcp"));
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unix_and_tcp_listeners_share_one_gate() {
    let dir = unique_dir("both");
    let (up, gate) = Gate::one_slot(4)
        .listen_unix(dir.join("sg.sock"))
        .listen(format!("tcp:127.0.0.1:{}", free_port()))
        .start_instant()
        .await;
    let clients = gate.clients();
    assert_eq!(clients.len(), 2);

    // Both listeners feed the same slot: concurrent requests through both never overlap upstream.
    let handles = (0..4)
        .map(|i| {
            spawn_post(
                &clients[i % 2],
                CHAT,
                &Req::chat(&format!("c{i}")).delay(ms(100)),
            )
        })
        .collect();
    for (resp, _) in join_all(handles).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(up.count(), 4);
    assert_eq!(up.max_concurrency(), 1);
    gate.assert_settled(&up, 1).await;
    drop(gate);
    let _ = std::fs::remove_dir_all(&dir);
}
