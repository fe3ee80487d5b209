//! The two clocks of the budgets: wall-clock Unix milliseconds (the quota windows, what is kept
//! on disk) and the monotonic clock (buckets' refills, windows' events), and the conversion
//! between them for what is written and read back.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock time in Unix milliseconds: `wall_ms`, the quota windows, `now_unix_ms`.
pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The budgets' clock: the machine's, unless `slotgate policy test` moved it (a fixture's clock
/// starts at a fixed time and moves only when a step moves it). Reading it costs one relaxed
/// atomic load over the machine's clock.
#[derive(Debug, Default)]
pub struct Clock {
    /// How far this clock is ahead of the machine's (behind, negative), in milliseconds.
    skew_ms: AtomicI64,
}

impl Clock {
    fn skew(&self) -> i64 {
        self.skew_ms.load(Ordering::Relaxed)
    }

    /// Wall-clock Unix milliseconds.
    pub fn wall_ms(&self) -> i64 {
        wall_ms().saturating_add(self.skew())
    }

    /// The monotonic clock.
    pub fn now(&self) -> Instant {
        shifted(Instant::now(), self.skew())
    }

    /// Milliseconds on the monotonic clock since this process first asked (a policy's
    /// `monotonic_ms`).
    pub fn monotonic_ms(&self) -> i64 {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let start = *START.get_or_init(Instant::now);
        (start.elapsed().as_millis() as i64).saturating_add(self.skew())
    }

    /// Both, read together.
    pub(super) fn both(&self) -> (Instant, u64) {
        let (now, wall) = clocks();
        let skew = self.skew();
        (
            shifted(now, skew),
            (wall as i64).saturating_add(skew).max(0) as u64,
        )
    }

    /// Moves the clock on by `ms` (buckets refill, windows age, quota windows turn).
    pub fn advance_ms(&self, ms: i64) {
        self.skew_ms.fetch_add(ms.max(0), Ordering::Relaxed);
    }

    /// Sets the wall clock to Unix milliseconds `ms`; the monotonic clock moves with it.
    pub fn set_wall_ms(&self, ms: i64) {
        self.skew_ms
            .store(ms.saturating_sub(wall_ms()), Ordering::Relaxed);
    }
}

/// `at` moved by `ms` milliseconds, as far as the machine's monotonic clock can go.
fn shifted(at: Instant, ms: i64) -> Instant {
    let by = Duration::from_millis(ms.unsigned_abs());
    match ms >= 0 {
        true => at.checked_add(by).unwrap_or(at),
        false => at.checked_sub(by).unwrap_or(at),
    }
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
    fn a_moved_clock_moves_both_ways_of_telling_time() {
        let clock = Clock::default();
        clock.set_wall_ms(1_800_000_000_000);
        assert!((clock.wall_ms() - 1_800_000_000_000).abs() < 1000);
        let (m0, w0) = (clock.now(), clock.wall_ms());
        clock.advance_ms(90_000);
        assert!(clock.now().duration_since(m0) >= Duration::from_secs(90));
        assert!(clock.wall_ms() - w0 >= 90_000);
        let (now, wall) = clock.both();
        assert!((wall as i64 - clock.wall_ms()).abs() < 1000);
        assert!(now >= m0 + Duration::from_secs(90));
    }

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
