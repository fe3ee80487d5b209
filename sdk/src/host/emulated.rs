//! The native stand-in for the host's state (`sidecar/src/policy/state.rs`): the same bucket and
//! window arithmetic, on a manual clock, one instance per thread so parallel tests do not interfere.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use super::Level;

#[derive(Default)]
struct Emulator {
    now_ms: i64,
    buckets: HashMap<String, Bucket>,
    windows: HashMap<String, Window>,
    logs: Vec<(Level, String)>,
}

struct Bucket {
    level: f64,
    updated_ms: i64,
}

#[derive(Default)]
struct Window {
    events: VecDeque<(i64, i64)>,
    total: i64,
}

thread_local! {
    static HOST: RefCell<Emulator> = RefCell::default();
}

fn with<T>(f: impl FnOnce(&mut Emulator) -> T) -> T {
    HOST.with(|h| f(&mut h.borrow_mut()))
}

pub(crate) fn reset() {
    with(|h| *h = Emulator::default());
}

pub(crate) fn advance_ms(ms: i64) {
    with(|h| h.now_ms += ms.max(0));
}

pub(crate) fn take_logs() -> Vec<(Level, String)> {
    with(|h| std::mem::take(&mut h.logs))
}

pub(super) fn log(level: i32, msg: &str) {
    let level = match level {
        0 => Level::Error,
        1 => Level::Warn,
        2 => Level::Info,
        _ => Level::Debug,
    };
    // Shown by the test harness when a test fails.
    eprintln!("[policy {level:?}] {msg}");
    with(|h| h.logs.push((level, msg.to_owned())));
}

pub(super) fn now_ms() -> i64 {
    with(|h| h.now_ms)
}

pub(super) fn bucket_take(key: &str, capacity: f64, refill: f64, amount: f64) -> f64 {
    with(|h| {
        let b = h.bucket(key, capacity, refill);
        let (level, wait) = crate::bucket::take(b.level, capacity, refill, amount);
        b.level = level;
        wait
    })
}

pub(super) fn bucket_refund(key: &str, capacity: f64, refill: f64, amount: f64) -> f64 {
    with(|h| {
        let b = h.bucket(key, capacity, refill);
        b.level = crate::bucket::refund(b.level, capacity, amount);
        b.level
    })
}

pub(super) fn window_add(key: &str, window_ms: i64, amount: i64) -> i64 {
    with(|h| {
        let now = h.now_ms;
        let w = h.windows.entry(key.to_owned()).or_default();
        while let Some(&(at, n)) = w.events.front() {
            if now - at < window_ms.max(0) {
                break;
            }
            w.total -= n;
            w.events.pop_front();
        }
        if amount != 0 {
            w.events.push_back((now, amount));
            w.total += amount;
        }
        w.total
    })
}

impl Emulator {
    /// The bucket `key`, created full and refilled up to now.
    fn bucket(&mut self, key: &str, capacity: f64, refill: f64) -> &mut Bucket {
        let now = self.now_ms;
        let b = self.buckets.entry(key.to_owned()).or_insert(Bucket {
            level: capacity,
            updated_ms: now,
        });
        let dt = (now - b.updated_ms) as f64 / 1000.0;
        b.level = crate::bucket::refilled(b.level, dt, capacity, refill);
        b.updated_ms = now;
        b
    }
}
