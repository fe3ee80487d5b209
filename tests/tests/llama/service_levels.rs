//! Service levels on a one-slot llama-server (docs/scheduling.md#deadlines), for real: requests that
//! say how long their answer is worth waiting for (`X-Slotgate-Deadline-Ms`) on a busy slot.

use std::time::Duration;

use slotgate_tests::llama::{chat, chat_usage, serial, LlamaServer, PROMPT};
use slotgate_tests::*;

const DEADLINE: &str = "x-slotgate-deadline-ms";

/// One slot held, then a burst of requests at one priority, alternating 60 s and 2 s deadlines:
/// each 2 s one starts within its 2 s (served before the 60 s ones that came before it), or is
/// refused at arrival when it cannot make it, or leaves at its deadline; none waits past it, and
/// every 60 s one is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn short_deadlines_go_first_or_are_refused_and_none_waits_past_its_deadline() {
    let _one = serial().await;
    let llama = LlamaServer::start(1).await;
    let n = llama
        .tokens_for(Duration::from_millis(400), (20, 4000))
        .await;
    let gate = Gate::one_slot(16)
        .queue_timeout("60s")
        .upstream_path(llama.socket())
        .start()
        .await;
    // Measured first, so that the estimate behind each refusal at arrival is the real one.
    for _ in 0..3 {
        chat_usage(
            &gate.client().post_json(CHAT, &chat(PROMPT, n, false)).await,
            n,
        );
    }
    let hold = spawn_post(
        &gate.client(),
        CHAT,
        &Req::from_json(chat(PROMPT, n, false)),
    );
    gate.wait_busy(1).await;
    let burst: Vec<(u64, _)> = (0..8)
        .map(|i| {
            let deadline = if i % 2 == 0 { 60_000 } else { 2_000 };
            let req =
                Req::from_json(chat(PROMPT, n, false)).header(DEADLINE, &deadline.to_string());
            (deadline, spawn_post(&gate.client(), CHAT, &req))
        })
        .collect();
    let (held, _) = hold.await.unwrap();
    chat_usage(&held, n);
    let (mut short_waits, mut long_waits, mut short_served) = (Vec::new(), Vec::new(), 0);
    for (deadline, task) in burst {
        let (resp, took) = task.await.unwrap();
        match (deadline, resp.status.as_u16()) {
            (60_000, _) => {
                chat_usage(&resp, n);
                long_waits.push(queue_wait_ms(&resp));
            }
            (_, 200) => {
                chat_usage(&resp, n);
                let waited = queue_wait_ms(&resp);
                assert!(waited <= 2_000, "started {waited} ms after arrival");
                short_waits.push(waited);
                short_served += 1;
            }
            (_, 429) => {
                assert_error(&resp, 429, "deadline_unreachable");
                assert!(took < Duration::from_millis(500), "refused after {took:?}");
            }
            (_, 504) => {
                assert_error(&resp, 504, "deadline_exceeded");
                assert!(
                    took >= Duration::from_millis(1_900) && took < Duration::from_millis(2_600),
                    "left the queue after {took:?}, its deadline 2 s"
                );
            }
            (_, other) => panic!("{other}: {}", resp.body),
        }
    }
    eprintln!("short waits {short_waits:?}, long waits {long_waits:?}");
    assert!(
        short_served >= 2,
        "only {short_served} short-deadline requests were served"
    );
    // Each short one started before every long one: they came interleaved, one priority.
    let (short_last, long_first) = (
        short_waits.iter().max().unwrap(),
        long_waits.iter().min().unwrap(),
    );
    assert!(
        short_last < long_first,
        "short {short_waits:?} vs long {long_waits:?}"
    );
    gate.assert_idle().await;
    llama.assert_idle().await;
}

/// A flood of background work (priority 10, a band holding at most half the queue) on one real
/// slot: the flood gets its places and 429 `band_queue_full` beyond them, and interactive requests
/// sent meanwhile still find a place and start within one service time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_background_flood_within_its_band_leaves_room_for_interactive_work() {
    let _one = serial().await;
    let llama = LlamaServer::start(1).await;
    let n = llama
        .tokens_for(Duration::from_millis(400), (20, 4000))
        .await;
    let config = unique_dir("bands").join("slotgate.toml");
    std::fs::write(
        &config,
        "[bands.background]\npriorities = [10, 1000]\nqueue = 0.5\n",
    )
    .unwrap();
    let gate = Gate::one_slot(8)
        .queue_timeout("60s")
        .trust_client_priority()
        .opt("--config", config.display())
        .upstream_path(llama.socket())
        .start()
        .await;
    let service = {
        let t0 = std::time::Instant::now();
        chat_usage(
            &gate.client().post_json(CHAT, &chat(PROMPT, n, false)).await,
            n,
        );
        t0.elapsed()
    };
    let mut background = chat(PROMPT, n, false);
    background["priority"] = 10.into();
    let flood: Vec<_> = (0..12)
        .map(|_| spawn_post(&gate.client(), CHAT, &Req::from_json(background.clone())))
        .collect();
    let s = gate
        .wait_status(
            Duration::from_secs(5),
            "the band's four places taken",
            |s| s["bands"][0]["waiting"] == 4,
        )
        .await;
    assert_eq!(s["bands"][0]["queue_limit"], 4, "{s}");
    // Three interactive requests, one after another, while the flood is still queued.
    for _ in 0..3 {
        let resp = gate.client().post_json(CHAT, &chat(PROMPT, n, false)).await;
        chat_usage(&resp, n);
        let waited = Duration::from_millis(queue_wait_ms(&resp));
        assert!(
            waited <= service + service / 2,
            "waited {waited:?}, one answer takes {service:?}"
        );
    }
    let (mut served, mut refused) = (0, 0);
    for (resp, _) in join_all(flood).await {
        match resp.status.as_u16() {
            200 => served += 1,
            429 => {
                assert_error(&resp, 429, "band_queue_full");
                refused += 1;
            }
            other => panic!("{other}: {}", resp.body),
        }
    }
    // One in service and four waiting at the flood's peak; the rest refused at arrival.
    assert_eq!((served, refused), (5, 7));
    let s = gate.status().await;
    assert_eq!(s["bands"][0]["refused"], 7, "{s}");
    gate.wait_outcome("band_queue_full", 7).await;
    gate.assert_idle().await;
    llama.assert_idle().await;
}
