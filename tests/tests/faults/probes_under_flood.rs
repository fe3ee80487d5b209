//! Probes always answer: a slow-loris flood of half-sent request heads, more than a listener's
//! connection cap and reopened as fast as slotgate closes them, leaves `/readyz` (admin listener)
//! and `/health` (client listener) answering within a kubelet's one-second timeout. A peer past
//! `--max-connections-per-peer` gets only probes answered, and each such close is counted.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use slotgate_tests::flood::{get_from, probe, Flood, HALF_HEAD};
use slotgate_tests::*;

/// A kubelet's probe timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Probes sent under each flood, as in the issue.
const PROBES: usize = 22;
/// Connections the flood holds: beyond the admin listener's 64 and the client test's
/// `--max-connections`, and beyond either with the spare lane's 64 added.
const FLOOD: usize = 200;
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const OTHER_LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// One flood at a time: two would compete for this machine's cores with each other's probes.
static ONE_FLOOD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn refused(listener: &'static str, reason: &'static str) -> [(&'static str, &'static str); 2] {
    [("listener", listener), ("reason", reason)]
}

/// Sends the probes one after another (a tenth of a second apart) and returns the failures: the
/// probe's number and what it got (`None`: no answer within the timeout).
async fn probe_under(flood: &Flood, target: &Target, path: &str) -> Vec<(usize, Option<u16>)> {
    let mut failed = Vec::new();
    for i in 0..PROBES {
        let got = probe(target, path, PROBE_TIMEOUT).await;
        if got != Some(200) {
            failed.push((i, got));
        }
        assert!(
            flood.held() >= 64,
            "the flood must hold its connections while the probes run (holds {})",
            flood.held()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_probes_answer_through_a_slow_loris_flood() {
    let _one = ONE_FLOOD.lock().await;
    let (_up, gate) = Gate::new().start_instant().await;
    let admin: SocketAddr = gate
        .admin_addr()
        .trim_start_matches("tcp:")
        .parse()
        .unwrap();
    let target = Target::Tcp(admin);

    let flood = Flood::start(
        target.clone(),
        FLOOD,
        b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ",
    );
    flood.wait_held(FLOOD - 8, Duration::from_secs(10));
    let readyz = probe_under(&flood, &target, "/readyz").await;
    let livez = probe(&target, "/livez", PROBE_TIMEOUT).await;
    let churned = flood.opened() - FLOOD;
    drop(flood);

    assert!(
        readyz.is_empty(),
        "every one-second /readyz probe must answer 200 under a flood of {FLOOD} half-sent heads; \
         failed (probe, status): {readyz:?}\n{}",
        gate.stderr_text()
    );
    assert_eq!(livez, Some(200), "/livez under the flood");
    assert!(
        churned > 0,
        "slotgate must close half-sent heads past its limits to make room (none was reopened)"
    );
    // The flood's connections close as it ends; then the admin listener serves 127.0.0.1 in full.
    let text = eventually(
        Duration::from_secs(3),
        "/metrics answered once the flood has gone",
        || async {
            let r = gate.admin_get("/metrics").await;
            (r.status == 200).then_some(r.body)
        },
    )
    .await;
    assert!(
        Metrics::parse(&text).value_or_zero(
            "slotgate_connections_refused_total",
            &refused("admin", "evicted")
        ) > 0.0,
        "the closes are counted:\n{text}"
    );
    assert!(
        gate.stderr_text().contains("connection refused"),
        "and said in the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_health_answers_through_more_half_heads_than_max_connections() {
    let _one = ONE_FLOOD.lock().await;
    let addr = SocketAddr::from(([127, 0, 0, 1], slotgate_tests::gate::free_port()));
    let (_up, gate) = Gate::new()
        .listen(format!("tcp:{addr}"))
        .max_connections(64)
        .start_instant()
        .await;
    let target = Target::Tcp(addr);

    let flood = Flood::start(target.clone(), FLOOD, HALF_HEAD);
    flood.wait_held(FLOOD - 8, Duration::from_secs(10));
    let health = probe_under(&flood, &target, "/health").await;
    let v1_health = probe(&target, "/v1/health", PROBE_TIMEOUT).await;
    let evicted = gate.metrics().await.value_or_zero(
        "slotgate_connections_refused_total",
        &refused("client", "evicted"),
    );
    drop(flood);

    assert!(
        health.is_empty(),
        "every one-second /health probe must answer 200 under {FLOOD} half-sent heads with \
         --max-connections 64; failed (probe, status): {health:?}\n{}",
        gate.stderr_text()
    );
    assert_eq!(v1_health, Some(200), "/v1/health under the flood");
    assert!(evicted > 0.0, "the closes are counted");

    // Once the flood is gone, requests are served as usual again.
    let resp = gate.client().get("/v1/models").await;
    assert_eq!(resp.status, 200, "{}", resp.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_past_its_cap_gets_only_probes_and_is_counted() {
    let addr = SocketAddr::from(([127, 0, 0, 1], slotgate_tests::gate::free_port()));
    let (_up, gate) = Gate::new()
        .listen(format!("tcp:{addr}"))
        .opt("--max-connections-per-peer", 4)
        .start_instant()
        .await;
    let client = Client::tcp(addr);
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut c = client.connect().await.unwrap();
        assert_eq!(c.get("/v1/models").await.unwrap().status, 200);
        held.push(c);
    }

    let (status, text) = get_from(LOOPBACK, addr, "/v1/models")
        .await
        .expect("a peer past its cap is answered, then closed");
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("too_many_connections"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    assert_eq!(
        get_from(LOOPBACK, addr, "/health").await.map(|r| r.0),
        Some(200),
        "a probe of a peer past its cap is still answered"
    );
    let (other, text) = get_from(OTHER_LOOPBACK, addr, "/v1/models").await.unwrap();
    assert_eq!(other, 200, "another peer keeps its own share: {text}");

    gate.wait_metric(
        "slotgate_connections_refused_total",
        &refused("client", "peer_cap"),
        1.0,
    )
    .await;
    let log = gate.stderr_text();
    assert!(
        log.lines()
            .any(|l| l.contains("connection refused") && l.contains("peer_cap")),
        "a refused connection is in the log:\n{log}"
    );

    drop(held.pop());
    eventually(
        Duration::from_secs(2),
        "a place given back serves the peer again",
        || async {
            (get_from(LOOPBACK, addr, "/v1/models").await.map(|r| r.0) == Some(200)).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_peer_is_capped_by_its_uid() {
    let (_up, gate) = Gate::new()
        .opt("--max-connections-per-peer", 2)
        .start_instant()
        .await;
    let client = gate.client();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = client.connect().await.unwrap();
        assert_eq!(c.get("/v1/models").await.unwrap().status, 200);
        held.push(c);
    }
    let resp = client.get("/v1/models").await;
    assert_eq!(resp.status, 429, "{}", resp.body);
    assert_eq!(client.get("/health").await.status, 200);
    gate.wait_metric(
        "slotgate_connections_refused_total",
        &refused("client", "peer_cap"),
        1.0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_past_the_deadline_is_closed_and_counted_an_idle_connection_is_not() {
    let (_up, gate) = Gate::new().header_timeout("500ms").start_instant().await;
    let (_, took) = gate
        .client()
        .raw_exchange(HALF_HEAD, Duration::from_secs(4))
        .await
        .expect("a half-sent head is closed");
    assert!(took >= Duration::from_millis(300), "closed after {took:?}");
    gate.wait_metric(
        "slotgate_connections_refused_total",
        &refused("client", "header_timeout"),
        1.0,
    )
    .await;

    // A keep-alive connection idle past the deadline is closed too, but it sent no slow head.
    let mut c = gate.client().connect().await.unwrap();
    assert_eq!(c.get("/v1/models").await.unwrap().status, 200);
    tokio::time::sleep(Duration::from_millis(900)).await;
    drop(c);
    gate.metrics().await.assert_value(
        "slotgate_connections_refused_total",
        &refused("client", "header_timeout"),
        1.0,
    );
}
