//! The two clocks of the budgets: wall-clock Unix milliseconds (the quota windows, what is kept
//! on disk) and the monotonic clock (buckets' refills, windows' events), and the conversion
//! between them for what is written and read back.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock time in Unix milliseconds: `wall_ms`, the quota windows, `now_unix_ms`.
pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Now, on the monotonic clock and in Unix milliseconds.
pub(super) fn clocks() -> (Instant, u64) {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    (Instant::now(), wall)
}

/// The Unix milliseconds of `at`.
pub(super) fn wall_ms_of(at: Instant, now: Instant, wall: u64) -> u64 {
    wall.saturating_sub(now.saturating_duration_since(at).as_millis() as u64)
}

/// The instant of Unix milliseconds `ms`: one in the future (a clock set back) is now; one before
/// this machine's monotonic clock began is as early as it can be told.
pub(super) fn instant_of(ms: u64, now: Instant, wall: u64) -> Instant {
    let ago = Duration::from_millis(wall.saturating_sub(ms));
    now.checked_sub(ago).unwrap_or_else(|| {
        // As far back as the clock goes, halving until it can.
        let mut back = ago;
        loop {
            back /= 2;
            if let Some(t) = now.checked_sub(back) {
                return t;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_and_monotonic_times_convert_both_ways() {
        let (now, wall) = clocks();
        let ago = now - Duration::from_millis(1500);
        assert_eq!(wall_ms_of(ago, now, wall), wall - 1500);
        let back = instant_of(wall - 1500, now, wall);
        assert_eq!(now.duration_since(back), Duration::from_millis(1500));
        assert_eq!(
            instant_of(wall + 10_000, now, wall),
            now,
            "the future is now"
        );
        assert!(
            instant_of(0, now, wall) <= now,
            "before boot: as early as it goes"
        );
    }
}
