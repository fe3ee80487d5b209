//! Fault matrix, slotgate-itself rows: signals and resource exhaustion under load end with every
//! request answered exactly once, llama-server (the fake) never over `--slots`, and a settled gate
//! (or, after a shutdown, a clean exit with nothing forwarded that was not admitted).
//!
//! | row | test |
//! |-----|------|
//! | a SIGHUP storm under load | `a_sighup_storm_under_load_fails_no_request` |
//! | SIGTERM with a full queue and long streams | `sigterm_with_a_full_queue_and_busy_streams_drains_within_the_deadline` (the simpler one-slot case: `tests/tests/gate/shutdown.rs::sigterm_drains_inflight_and_rejects_the_queue`) |
//! | the file-descriptor limit reached | covered by `tests/tests/faults/fd_exhaustion.rs::accept_backs_off_when_file_descriptors_run_out` |
//!
//! A gate that has exited has no admin listener and no descriptors left to check: after SIGTERM, the
//! invariants of [`RunningGate::assert_settled`] that still mean something are checked one by one
//! on the fake (forwarded once, never over `--slots`, nothing left running there).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slotgate_tests::wat::{install, versioned};
use slotgate_tests::*;

/// How one request of the load ended.
#[derive(Debug)]
struct Outcome {
    tag: String,
    status: u16,
    /// The tag the answer carried (every JSON body or SSE event echoes it).
    echoed: bool,
    /// For a stream: it ended with `[DONE]` and no error.
    complete: bool,
}

/// Clients sending back to back, half of them streaming, until told to stop.
struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Outcome>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(gate: &RunningGate, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..clients)
            .map(|i| {
                let (client, stop, seen) = (gate.client(), stop.clone(), seen.clone());
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let tag = format!("c{i}-{n}");
                        let outcome = if i % 2 == 0 {
                            let resp = client.post_chat(&Req::chat(&tag)).await;
                            Outcome {
                                echoed: resp.status == 200 && resp.tag().as_deref() == Some(&tag),
                                status: resp.status.as_u16(),
                                complete: true,
                                tag,
                            }
                        } else {
                            let req = Req::chat(&tag).chunks(3, ms(10));
                            let stream = client.stream(CHAT, &req.json()).await;
                            let status = stream.status.as_u16();
                            let sse = stream.read_sse(Duration::from_secs(10)).await;
                            Outcome {
                                echoed: sse.data.iter().all(|d| d.contains(&tag)),
                                status,
                                complete: sse.complete() && sse.data.len() == 4,
                                tag,
                            }
                        };
                        seen.lock().unwrap().push(outcome);
                        n += 1;
                    }
                })
            })
            .collect();
        Load { stop, seen, tasks }
    }

    /// Stops the clients and returns every outcome.
    async fn finish(self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("a load client panicked");
        }
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sighup_storm_under_load_fails_no_request() {
    const SIGNALS: u32 = 50;
    let dir = unique_dir("fault-hup");
    let live = dir.join("live.wat");
    let (v1, v2) = (versioned(&dir, 1), versioned(&dir, 2));
    install(&v1, &live);
    let guard = wat::fixed(&dir, "guard", r#"{"verdict":"allow"}"#);
    let (up, mut gate) = Gate::new()
        .slots(2)
        .queue_depth(64)
        .policies(&[(&live, None), (&guard, None)])
        .start_instant()
        .await;
    let load = Load::start(&gate, 4);

    // Each signal finds the live module changed, so each reload that runs has real work to do; the
    // signals come faster than reloads finish, so some coalesce.
    for i in 0..SIGNALS {
        install(if i % 2 == 0 { &v2 } else { &v1 }, &live);
        gate.signal("HUP");
        tokio::time::sleep(ms(60)).await;
    }
    // The last signal came after the last install (v1): that version ends up serving.
    let client = gate.client();
    eventually(
        Duration::from_secs(20),
        "v1 serving after the storm",
        || {
            let client = client.clone();
            async move {
                let resp = client.post_chat(&Req::chat("probe")).await;
                (resp.header("x-policy-version").as_deref() == Some("1")).then_some(())
            }
        },
    )
    .await;
    let outcomes = load.finish().await;

    let failed: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.status != 200 || !o.echoed || !o.complete)
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the SIGHUP storm, e.g. {:?}",
        failed.len(),
        outcomes.len(),
        failed.first()
    );
    assert!(
        outcomes.len() > 40,
        "too little load to prove anything: {}",
        outcomes.len()
    );
    // Every request the clients finished reached the upstream exactly once; the probes are extra.
    let probes = up.tags().iter().filter(|t| *t == "probe").count();
    assert_eq!(up.count(), outcomes.len() + probes);
    for o in &outcomes {
        assert!(
            up.saw_tag(&o.tag),
            "{} was answered but never forwarded",
            o.tag
        );
    }
    let m = gate.metrics().await;
    let reloaded = m.value_or_zero(
        "slotgate_policy_reloads_total",
        &[("policy", "live"), ("result", "ok")],
    );
    assert!(
        reloaded >= 2.0,
        "only {reloaded} reloads swapped a version in: the storm did no work\n{}",
        m.text
    );
    m.assert_value("slotgate_policy_reloads_total", &[("result", "error")], 0.0);
    assert!(gate.try_exited().is_none(), "slotgate died in the storm");
    assert_eq!(gate.livez().await, 200);
    eprintln!(
        "{} requests under {SIGNALS} SIGHUPs, {reloaded} reloads swapped",
        outcomes.len()
    );
    // `assert_forwarded_once` would count the probes, all tagged alike.
    let mut tags = up.tags();
    tags.retain(|t| t != "probe");
    let before = tags.len();
    tags.sort_unstable();
    tags.dedup();
    assert_eq!(before, tags.len(), "a request was forwarded twice");
    gate.assert_idle().await;
    gate.assert_fds_settled().await;
    assert!(up.max_concurrency() <= 2, "{}", up.max_concurrency());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_with_a_full_queue_and_busy_streams_drains_within_the_deadline() {
    const SLOTS: usize = 2;
    const QUEUE: usize = 4;
    let drain = Duration::from_secs(3);
    let (up, mut gate) = Gate::new()
        .slots(SLOTS)
        .queue_depth(QUEUE)
        .drain_timeout("3s")
        .start_instant()
        .await;
    let client = gate.client();
    let socket = gate.socket_path();

    // Every slot streams: one answer ends within the drain deadline (~1 s), one would take ~20 s.
    let mut short = client
        .stream_chat(&Req::chat("short").chunks(10, ms(100)))
        .await;
    let mut long = client
        .stream_chat(&Req::chat("long").chunks(200, ms(100)))
        .await;
    assert_eq!((short.status.as_u16(), long.status.as_u16()), (200, 200));
    short.first_event(Duration::from_secs(5)).await;
    long.first_event(Duration::from_secs(5)).await;
    gate.wait_busy(SLOTS as u64).await;
    let mut queued = Vec::new();
    for i in 0..QUEUE {
        queued.push(gate.enqueue(&Req::chat(&format!("q{i}"))).await);
    }
    let overflow = client.post_chat(&Req::chat("overflow")).await;
    assert_error(&overflow, 429, "queue_full");

    gate.sigterm();
    let t0 = Instant::now();
    for (resp, _) in join_all(queued).await {
        assert_error(&resp, 503, "shutting_down");
        retry_after(&resp);
    }
    eventually(
        Duration::from_secs(2),
        "the listen socket is unlinked",
        || async { (!socket.exists()).then_some(()) },
    )
    .await;

    let short = short.read_sse(Duration::from_secs(10)).await;
    assert!(
        short.complete(),
        "a stream that ends within the drain deadline must finish intact: {short:?}"
    );
    assert_eq!(short.data.len(), 11, "10 chunks + usage: {:?}", short.data);
    let long = long.read_sse(Duration::from_secs(15)).await;
    let cut_after = t0.elapsed();
    assert!(
        !long.complete(),
        "a stream longer than the drain deadline was not cut: {} events",
        long.data.len()
    );
    let status = gate.wait_exit(Duration::from_secs(10)).await;
    let exited_after = t0.elapsed();
    assert!(
        status.success(),
        "exit status {status}; stderr:\n{}",
        gate.stderr_text()
    );
    // Loose bounds: the cut comes at the deadline, not before it and not long after.
    assert!(
        cut_after >= drain - ms(500),
        "the long stream was cut {cut_after:?} after SIGTERM, before the {drain:?} drain deadline"
    );
    assert!(
        exited_after < drain + Duration::from_secs(5),
        "exited {exited_after:?} after SIGTERM with a {drain:?} drain deadline"
    );
    assert!(!socket.exists(), "socket file left behind");

    let mut tags = up.tags();
    tags.sort_unstable();
    assert_eq!(
        tags,
        ["long", "short"],
        "queued or refused requests were forwarded during shutdown"
    );
    up.assert_forwarded_once();
    assert!(up.max_concurrency() <= SLOTS, "{}", up.max_concurrency());
    eventually(
        Duration::from_secs(3),
        "the cut stream ends at the upstream",
        || async { (up.current() == 0).then_some(()) },
    )
    .await;
}
