//! Host functions (ABI v1 imports, module `slotgate`): log, a monotonic and a wall clock, token
//! buckets, sliding-window counters, calendar quotas and named events. State lives in the host, so it outlives the per-call instance; keys are
//! the policy's own (the host namespaces them per policy).
//!
//! On wasm32 these call the imports. Natively they run an in-process emulation with the same
//! semantics and a manual clock, one per thread, so a policy's unit tests exercise the same logic;
//! [`testing`](crate::testing) resets it, moves its clock and reads its log.

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod emulated;
#[cfg(not(target_arch = "wasm32"))]
use emulated as imp;

/// Longest key or log message the host accepts. A longer key traps (as does this SDK, natively); a
/// longer log message is cut to fit by [`log`].
pub const MAX_HOST_STRING: usize = 4096;

/// Severity of a [`log`] message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Something is wrong with the policy or its settings.
    Error = 0,
    /// Worth an operator's attention.
    Warn = 1,
    /// Routine.
    Info = 2,
    /// Detail for debugging a policy.
    Debug = 3,
}

/// Logs `msg` through the host's logger, tagged with the policy's name. Messages longer than
/// [`MAX_HOST_STRING`] bytes are cut at a character boundary.
pub fn log(level: Level, msg: &str) {
    let mut end = msg.len().min(MAX_HOST_STRING);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    imp::log(level as i32, &msg[..end]);
}

/// Monotonic milliseconds since an arbitrary start (the host's, not the Unix epoch: wall-clock time
/// is [`EvaluateInput::now_unix_ms`](crate::EvaluateInput::now_unix_ms)).
pub fn now_ms() -> i64 {
    imp::now_ms()
}

/// Takes `amount` from the token bucket `key` (created full; refilled at `refill_per_sec` up to
/// `capacity`). Returns `0.0` when taken; otherwise takes nothing and returns the seconds until
/// `amount` will be available, `f64::INFINITY` when it never will be (`amount > capacity`, or no
/// refill).
pub fn bucket_take(key: &str, capacity: f64, refill_per_sec: f64, amount: f64) -> f64 {
    check_key(key);
    imp::bucket_take(key, capacity, refill_per_sec, amount)
}

/// Gives `amount` back to the bucket `key`, up to its `capacity`; a negative amount charges more,
/// and may take the level below zero. Returns the new level.
pub fn bucket_refund(key: &str, capacity: f64, refill_per_sec: f64, amount: f64) -> f64 {
    check_key(key);
    imp::bucket_refund(key, capacity, refill_per_sec, amount)
}

/// Adds `amount` to the sliding-window counter `key` now and returns its total over the last
/// `window_ms` milliseconds. `amount` 0 only reads.
pub fn window_add(key: &str, window_ms: i64, amount: i64) -> i64 {
    check_key(key);
    imp::window_add(key, window_ms, amount)
}

/// The level of the token bucket `key` now, refilled as `capacity` and `refill_per_sec` say,
/// without taking anything or creating it (a bucket never used reads `capacity`). On the fleet
/// backend: the fleet's level as last synced plus what this sidecar's lease holds.
pub fn bucket_level(key: &str, capacity: f64, refill_per_sec: f64) -> f64 {
    check_key(key);
    imp::bucket_level(key, capacity, refill_per_sec)
}

/// Wall-clock time: milliseconds since the Unix epoch, as the host's clock says (which may jump;
/// use [`now_ms`] to measure durations).
pub fn wall_ms() -> i64 {
    imp::wall_ms()
}

/// Takes `amount` from the calendar quota `key` of `limit` per `period` (`hour`, `day`, `week` or
/// `month`, optionally `@` an IANA time zone: `day@Europe/Paris`; see
/// [`calendar`](crate::calendar)). Returns `0.0` when taken; otherwise takes nothing and returns
/// the seconds until the window ends and the quota is whole again, `f64::INFINITY` when `amount`
/// is over `limit` (never). An operator's limit for this key (the quota admin API) replaces
/// `limit`. A period that does not parse or names an unknown zone traps.
pub fn quota_take(key: &str, period: &str, limit: f64, amount: f64) -> f64 {
    check_key(key);
    check_key(period);
    imp::quota_take(key, period, limit, amount)
}

/// Gives `amount` back to the quota `key` in the window that holds `at_unix_ms` (the time it was
/// taken: [`Completion::evaluated_unix_ms`](crate::Completion::evaluated_unix_ms); 0: now), never
/// above the limit; a negative amount charges more (the usage beyond the reservation). Once that
/// window is over nothing changes. Returns what is left in that window.
pub fn quota_refund(key: &str, period: &str, limit: f64, amount: f64, at_unix_ms: i64) -> f64 {
    check_key(key);
    check_key(period);
    imp::quota_refund(key, period, limit, amount, at_unix_ms)
}

/// What is left of the quota `key` in the current window, without taking anything.
pub fn quota_level(key: &str, period: &str, limit: f64) -> f64 {
    check_key(key);
    check_key(period);
    imp::quota_level(key, period, limit)
}

/// The limit in force for the quota `key`: an operator's (the quota admin API), else `limit`.
pub fn quota_limit(key: &str, period: &str, limit: f64) -> f64 {
    check_key(key);
    check_key(period);
    imp::quota_limit(key, period, limit)
}

/// Unix milliseconds when the current window of `period` ends (when quotas over it are whole
/// again): for `reset` times and `Retry-After`.
pub fn quota_reset_ms(period: &str) -> i64 {
    check_key(period);
    imp::quota_reset_ms(period)
}

/// Counts the event `name` (`[a-z0-9_]`, at most 64 bytes; others trap) in the metric
/// `slotgate_policy_events_total{policy, event}`: what a policy wants an operator to see, such as
/// a tenant past the soft limit of its quota. Log a line beside it for the detail.
pub fn event(name: &str) {
    assert!(
        is_event_name(name),
        "event name `{name}`: use [a-z0-9_], at most 64 bytes"
    );
    imp::event(name);
}

/// Whether `name` is a valid [`event`] name.
pub fn is_event_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The host traps on an oversized key; fail the same way natively, with a message.
fn check_key(key: &str) {
    assert!(
        key.len() <= MAX_HOST_STRING,
        "host state key of {} bytes is over the {MAX_HOST_STRING}-byte limit",
        key.len()
    );
}

#[cfg(all(target_arch = "wasm32", feature = "v2"))]
#[path = "host/component.rs"]
mod imp;

/// `fn $name([$s...] $arg...) -> $ret`: the import `slotgate.$name`, declared, and a safe
/// function that calls it with each string `$s` as a pointer and a length. (The host only reads
/// those bytes, borrowed for the call, and returns numbers.)
#[cfg(all(target_arch = "wasm32", not(feature = "v2")))]
macro_rules! imports {
    ($(fn $name:ident([$($s:ident),*] $($arg:ident: $ty:ty),*) $(-> $ret:ty)?;)*) => {
        mod ffi {
            #[link(wasm_import_module = "slotgate")]
            extern "C" {
                $(pub fn $name($(_: str_ptr!($s), _: usize,)* $(_: $ty),*) $(-> $ret)?;)*
            }
        }

        $(
            #[allow(
                unsafe_code,
                reason = "calls the host functions the policy ABI imports"
            )]
            pub fn $name($($s: &str,)* $($arg: $ty),*) $(-> $ret)? {
                // SAFETY: the host only reads each string's bytes, borrowed for the call, and
                // returns numbers.
                unsafe { ffi::$name($($s.as_ptr(), $s.len(),)* $($arg),*) }
            }
        )*
    };
}

/// A string's pointer type, in the imports' declarations (one per string argument).
#[cfg(all(target_arch = "wasm32", not(feature = "v2")))]
macro_rules! str_ptr {
    ($s:ident) => {
        *const u8
    };
}

#[cfg(all(target_arch = "wasm32", not(feature = "v2")))]
mod imp {
    imports! {
        fn now_ms([]) -> i64;
        fn wall_ms([]) -> i64;
        fn bucket_take([key] capacity: f64, refill: f64, amount: f64) -> f64;
        fn bucket_refund([key] capacity: f64, refill: f64, amount: f64) -> f64;
        fn bucket_level([key] capacity: f64, refill: f64) -> f64;
        fn window_add([key] window_ms: i64, amount: i64) -> i64;
        fn quota_take([key, period] limit: f64, amount: f64) -> f64;
        fn quota_refund([key, period] limit: f64, amount: f64, at_unix_ms: i64) -> f64;
        fn quota_level([key, period] limit: f64) -> f64;
        fn quota_limit([key, period] limit: f64) -> f64;
        fn quota_reset_ms([period]) -> i64;
        fn event([name]);
    }

    // `log` takes its level before its string.
    #[link(wasm_import_module = "slotgate")]
    extern "C" {
        #[link_name = "log"]
        fn host_log(level: i32, ptr: *const u8, len: usize);
    }

    #[allow(
        unsafe_code,
        reason = "calls the host functions the policy ABI imports"
    )]
    pub fn log(level: i32, msg: &str) {
        // SAFETY: the host only reads `msg.len()` bytes at `msg.as_ptr()`, borrowed for the call.
        unsafe { host_log(level, msg.as_ptr(), msg.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn buckets_take_wait_refill_and_refund_like_the_host() {
        testing::reset();
        assert_eq!(bucket_take("a", 100.0, 10.0, 60.0), 0.0);
        assert_eq!(
            bucket_take("a", 100.0, 10.0, 60.0),
            2.0,
            "40 left, 20 short"
        );
        assert_eq!(
            bucket_take("b", 100.0, 10.0, 60.0),
            0.0,
            "keys are separate"
        );
        testing::advance_ms(2_000);
        assert_eq!(bucket_take("a", 100.0, 10.0, 60.0), 0.0, "refilled to 60");
        assert_eq!(bucket_refund("a", 100.0, 10.0, 30.0), 30.0);
        assert_eq!(bucket_refund("a", 100.0, 10.0, 500.0), 100.0, "capped");
        assert_eq!(bucket_refund("a", 100.0, 10.0, -150.0), -50.0, "debt");
        assert_eq!(bucket_take("a", 100.0, 10.0, 10.0), 6.0);
        assert_eq!(bucket_take("a", 100.0, 10.0, 101.0), f64::INFINITY);
        assert_eq!(bucket_take("c", 100.0, 0.0, 100.0), 0.0);
        assert_eq!(bucket_take("c", 100.0, 0.0, 1.0), f64::INFINITY);
    }

    #[test]
    fn windows_forget_old_events() {
        testing::reset();
        assert_eq!(window_add("k", 1_000, 2), 2);
        testing::advance_ms(600);
        assert_eq!(window_add("k", 1_000, 3), 5);
        testing::advance_ms(400);
        assert_eq!(
            window_add("k", 1_000, 0),
            3,
            "the first event is 1000 ms old"
        );
        assert_eq!(window_add("k", 0, 0), 0, "a zero window forgets everything");
    }

    #[test]
    fn quotas_are_whole_again_when_their_window_ends() {
        testing::reset();
        // 30 minutes before a UTC midnight.
        testing::set_wall_ms(1_800_000_000_000 - 1_800_000_000_000 % 86_400_000 + 84_600_000);
        let midnight = quota_reset_ms("day");
        assert_eq!(midnight - wall_ms(), 1_800_000);
        assert_eq!(quota_take("t", "day", 100.0, 70.0), 0.0);
        assert_eq!(quota_level("t", "day", 100.0), 30.0);
        assert_eq!(
            quota_take("t", "day", 100.0, 40.0),
            1_800.0,
            "until midnight"
        );
        assert_eq!(quota_take("t", "day", 100.0, 101.0), f64::INFINITY);
        assert_eq!(
            quota_take("u", "day", 100.0, 40.0),
            0.0,
            "keys are separate"
        );
        let taken_at = wall_ms();
        assert_eq!(quota_refund("t", "day", 100.0, 20.0, taken_at), 50.0);
        assert_eq!(
            quota_refund("t", "day", 100.0, -60.0, 0),
            -10.0,
            "usage beyond"
        );
        testing::advance_ms(1_800_000);
        assert_eq!(wall_ms(), midnight);
        assert_eq!(quota_level("t", "day", 100.0), 100.0, "a new day");
        assert_eq!(
            quota_refund("t", "day", 100.0, 50.0, taken_at),
            -10.0,
            "yesterday's window is closed"
        );
        assert_eq!(quota_level("t", "day", 100.0), 100.0);
        assert_eq!(bucket_level("never", 5.0, 1.0), 5.0);
    }

    #[test]
    #[should_panic(expected = "expected hour, day, week or month")]
    fn a_bad_period_fails_like_the_host() {
        quota_take("t", "fortnight", 1.0, 1.0);
    }

    #[test]
    fn events_are_counted_and_checked() {
        testing::reset();
        event("soft_limit");
        assert_eq!(testing::take_events(), ["soft_limit"]);
        assert!(!is_event_name("Soft Limit"));
    }

    #[test]
    fn clock_and_log_are_emulated() {
        testing::reset();
        let t = now_ms();
        testing::advance_ms(1_500);
        assert_eq!(now_ms() - t, 1_500);
        log(Level::Warn, &"é".repeat(MAX_HOST_STRING));
        let logs = testing::take_logs();
        assert_eq!(logs.len(), 1);
        assert_eq!(logs[0].0, Level::Warn);
        assert!(logs[0].1.len() <= MAX_HOST_STRING);
        assert!(testing::take_logs().is_empty());
    }

    #[test]
    #[should_panic(expected = "over the 4096-byte limit")]
    fn oversized_keys_fail_like_the_host() {
        window_add(&"k".repeat(MAX_HOST_STRING + 1), 1, 1);
    }
}
