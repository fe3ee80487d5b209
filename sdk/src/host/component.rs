//! The host functions of a v2 policy: the world's `log`, `clocks` and `state` imports, with the
//! same signatures and meaning as the v1 imports in `host.rs`. A bad quota period, an error in v2,
//! traps as it does in v1.

use crate::__component::bindings::slotgate::policy::{clocks, log, state};

pub fn log(level: i32, msg: &str) {
    let level = match level {
        0 => log::Level::Error,
        1 => log::Level::Warn,
        2 => log::Level::Info,
        _ => log::Level::Debug,
    };
    log::log(level, msg);
}

pub fn now_ms() -> i64 {
    clocks::monotonic_ms()
}

pub fn wall_ms() -> i64 {
    clocks::wall_ms()
}

pub fn bucket_take(key: &str, capacity: f64, refill: f64, amount: f64) -> f64 {
    state::bucket_take(key, capacity, refill, amount)
}

pub fn bucket_refund(key: &str, capacity: f64, refill: f64, amount: f64) -> f64 {
    state::bucket_refund(key, capacity, refill, amount)
}

pub fn bucket_level(key: &str, capacity: f64, refill: f64) -> f64 {
    state::bucket_level(key, capacity, refill)
}

pub fn window_add(key: &str, window_ms: i64, amount: i64) -> i64 {
    state::window_add(key, window_ms, amount)
}

fn or_trap<T>(r: Result<T, String>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

pub fn quota_take(key: &str, period: &str, limit: f64, amount: f64) -> f64 {
    or_trap(state::quota_take(key, period, limit, amount))
}

pub fn quota_refund(key: &str, period: &str, limit: f64, amount: f64, at: i64) -> f64 {
    or_trap(state::quota_refund(key, period, limit, amount, at))
}

pub fn quota_level(key: &str, period: &str, limit: f64) -> f64 {
    or_trap(state::quota_level(key, period, limit))
}

pub fn quota_limit(key: &str, period: &str, limit: f64) -> f64 {
    state::quota_limit(key, period, limit)
}

pub fn quota_reset_ms(period: &str) -> i64 {
    or_trap(state::quota_reset_ms(period))
}

pub fn event(name: &str) {
    state::event(name);
}
