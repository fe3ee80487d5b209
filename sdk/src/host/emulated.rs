//! The native stand-in for the host's state (`sidecar/src/policy/state.rs`): the same bucket,
//! window and quota arithmetic, on a manual clock, one instance per thread so parallel tests do not
//! interfere. The wall clock starts at [`WALL_START_MS`] (the default input's `now_unix_ms`) and
//! moves with the monotonic one.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use super::Level;
use crate::calendar::{self, Period};

/// The emulated wall clock at `now_ms` 0: the default input's `now_unix_ms`.
pub(crate) const WALL_START_MS: i64 = 1_800_000_000_000;

#[derive(Default)]
struct Emulator {
    now_ms: i64,
    buckets: HashMap<String, Bucket>,
    windows: HashMap<String, Window>,
    logs: Vec<(Level, String)>,
    events: Vec<String>,
    /// Where the wall clock is ahead of `WALL_START_MS + now_ms` (set by a test).
    wall_offset_ms: i64,
    /// Operators' quota limits, by key and period.
    quota_limits: HashMap<(String, String), f64>,
}

struct Bucket {
    level: f64,
    updated_ms: i64,
    /// As the last call gave it.
    capacity: f64,
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

pub(crate) fn take_events() -> Vec<String> {
    with(|h| std::mem::take(&mut h.events))
}

pub(crate) fn set_wall_ms(ms: i64) {
    with(|h| h.wall_offset_ms = ms - WALL_START_MS - h.now_ms);
}

pub(super) fn wall_ms() -> i64 {
    with(|h| WALL_START_MS + h.now_ms + h.wall_offset_ms)
}

pub(super) fn event(name: &str) {
    with(|h| h.events.push(name.to_owned()));
}

pub(super) fn bucket_level(key: &str, capacity: f64, refill: f64) -> f64 {
    with(|h| {
        let now = h.now_ms;
        h.buckets.get(key).map_or(capacity, |b| {
            let dt = (now - b.updated_ms) as f64 / 1000.0;
            crate::bucket::refilled(b.level, dt, capacity, refill)
        })
    })
}

/// The bucket of the window of `period` holding `at` (now when 0), and that window; panics (the
/// host traps) on a bad period.
fn quota_window(key: &str, period: &str, at: i64) -> (String, (i64, i64)) {
    let period = Period::parse(period).unwrap_or_else(|e| panic!("{e}"));
    let at = if at == 0 { wall_ms() } else { at };
    let window = calendar::window(&period, at).unwrap_or_else(|e| panic!("{e}"));
    (calendar::quota_bucket(key, &period, window.0), window)
}

pub(super) fn quota_take(key: &str, period: &str, limit: f64, amount: f64) -> f64 {
    let limit = quota_limit(key, period, limit);
    let (bucket, (_, end)) = quota_window(key, period, 0);
    match bucket_take(&bucket, limit, 0.0, amount) {
        0.0 => 0.0,
        _ if amount > limit => f64::INFINITY,
        _ => ((end - wall_ms()) as f64 / 1000.0).max(0.001),
    }
}

pub(super) fn quota_refund(key: &str, period: &str, limit: f64, amount: f64, at: i64) -> f64 {
    let limit = quota_limit(key, period, limit);
    let (bucket, (_, end)) = quota_window(key, period, at);
    if end <= wall_ms() {
        return bucket_level(&bucket, limit, 0.0);
    }
    bucket_refund(&bucket, limit, 0.0, amount)
}

pub(super) fn quota_level(key: &str, period: &str, limit: f64) -> f64 {
    let limit = quota_limit(key, period, limit);
    let (bucket, _) = quota_window(key, period, 0);
    bucket_level(&bucket, limit, 0.0)
}

pub(super) fn quota_limit(key: &str, period: &str, limit: f64) -> f64 {
    with(|h| {
        h.quota_limits
            .get(&(key.to_owned(), period.to_owned()))
            .copied()
            .unwrap_or(limit)
    })
}

/// The limit an operator set, as the quota admin API would: the current window, if in use, keeps
/// what it used, so what is left moves by the difference.
pub(crate) fn set_quota_limit(key: &str, period: &str, limit: Option<f64>) {
    let (bucket, _) = quota_window(key, period, 0);
    with(|h| {
        let id = (key.to_owned(), period.to_owned());
        match limit {
            Some(l) => {
                if let Some(b) = h.buckets.get_mut(&bucket) {
                    b.level += l - b.capacity;
                    b.capacity = l;
                }
                h.quota_limits.insert(id, l)
            }
            None => h.quota_limits.remove(&id),
        };
    });
}

pub(super) fn quota_reset_ms(period: &str) -> i64 {
    quota_window("", period, 0).1 .1
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
            capacity,
        });
        b.capacity = capacity;
        let dt = (now - b.updated_ms) as f64 / 1000.0;
        b.level = crate::bucket::refilled(b.level, dt, capacity, refill);
        b.updated_ms = now;
        b
    }
}
