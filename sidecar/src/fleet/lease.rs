//! One sidecar's lease of one fleet bucket: tokens held locally and spent without asking the store,
//! what is owed back to the store (unused tokens, refunds) or by it (debt), and the recent rate of
//! demand, which sizes the next top-up. Pure accounting: no I/O, no clock of its own.

use std::time::{Duration, Instant};

use crate::config::LeaseSettings;

/// How big a lease is and when it is topped up or given back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeasePolicy {
    /// A full lease covers this much of the sidecar's recent demand; also the time constant of the
    /// demand rate.
    pub horizon: Duration,
    /// Top the lease up once it holds less than this fraction of its target.
    pub low_water: f64,
    /// Never hold more than this fraction of the bucket's capacity: what bounds the fleet's error.
    pub max_share: f64,
    /// Give every token back after this long without a take.
    pub idle: Duration,
    /// Give back tokens held this long since they were granted, busy or not: a lease is a short
    /// loan, and the fleet bucket (and the other sidecars) should see them again.
    pub max_age: Duration,
}

impl From<LeaseSettings> for LeasePolicy {
    fn from(s: LeaseSettings) -> Self {
        LeasePolicy {
            horizon: s.horizon,
            low_water: 0.5,
            max_share: s.max_share,
            idle: s.idle,
            max_age: s.max_age,
        }
    }
}

impl Default for LeasePolicy {
    fn default() -> Self {
        LeaseSettings::default().into()
    }
}

/// What one sync asks of the fleet bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyncRequest {
    /// Tokens wanted for the lease.
    pub want: f64,
    /// Tokens handed back (positive) or charged (negative).
    pub settle: f64,
}

#[derive(Debug, Clone, Default)]
pub struct Lease {
    /// Tokens held, spendable now.
    tokens: f64,
    /// Owed to the fleet bucket at the next sync: unused tokens and refunds (positive), or debt
    /// (negative).
    settle: f64,
    /// Demand in tokens per second, decaying with the horizon as time constant.
    rate: f64,
    /// The last take (demand), for the rate and idleness.
    last: Option<Instant>,
    /// The sync sent and not yet answered, with its sequence number: sent again as it is until an
    /// answer comes, so the store applies it once (see `lease.lua`).
    inflight: Option<(u64, SyncRequest)>,
    /// The last sequence number used.
    seq: u64,
    /// The fleet bucket is nearly dry: hold only what a take needs, keep no reserve, so tokens are
    /// not stranded in one sidecar's lease while another is refused.
    scarce: bool,
    /// When the lease last went from empty to holding tokens.
    granted_at: Option<Instant>,
}

impl Lease {
    /// Takes `amount` from the lease if it holds that much. The demand counts towards the rate
    /// either way, so a sidecar that runs short asks for more next time.
    pub fn take(&mut self, amount: f64, now: Instant, policy: &LeasePolicy) -> bool {
        self.observe(amount, now, policy);
        if self.tokens >= amount {
            self.tokens -= amount;
            true
        } else {
            false
        }
    }

    /// Takes `amount` if held, without counting it as demand again (after a fetch for a take that
    /// [`Lease::take`] already counted).
    pub fn spend(&mut self, amount: f64) -> bool {
        if self.tokens >= amount {
            self.tokens -= amount;
            true
        } else {
            false
        }
    }

    /// Gives `amount` back to the fleet at the next sync (negative: charges it, a debt).
    pub fn settle(&mut self, amount: f64) {
        self.settle += amount;
    }

    /// What to ask for now so that the lease can serve `need` more tokens at once and covers its
    /// target; `want` is 0 while it holds enough. Always hands back what is owed.
    pub fn sync_request(&self, capacity: f64, need: f64, policy: &LeasePolicy) -> SyncRequest {
        let target = self.target(capacity, need, policy);
        let short = self.tokens < need || self.tokens < target * policy.low_water;
        SyncRequest {
            want: if short {
                (target - self.tokens).max(0.0)
            } else {
                0.0
            },
            settle: self.settle,
        }
    }

    /// The sync to send now, with its sequence number: the one in flight if its answer never came,
    /// else a new one if there is anything to ask or settle ([`Lease::sync_request`]).
    pub fn begin_sync(
        &mut self,
        capacity: f64,
        need: f64,
        policy: &LeasePolicy,
    ) -> Option<(u64, SyncRequest)> {
        if self.inflight.is_some() {
            return self.inflight;
        }
        let ask = self.sync_request(capacity, need, policy);
        if ask.want == 0.0 && ask.settle == 0.0 {
            return None;
        }
        self.seq += 1;
        self.inflight = Some((self.seq, ask));
        self.inflight
    }

    /// A sync that only reads the fleet bucket's level (nothing wanted or settled), unless one is in
    /// flight already.
    pub fn begin_read(&mut self) -> (u64, SyncRequest) {
        if let Some(inflight) = self.inflight {
            return inflight;
        }
        self.seq += 1;
        let read = SyncRequest {
            want: 0.0,
            settle: 0.0,
        };
        self.inflight = Some((self.seq, read));
        (self.seq, read)
    }

    /// The answer to sync `seq`: applied once (a second answer to the same sync is ignored).
    pub fn finish_sync(&mut self, seq: u64, granted: f64) -> bool {
        match self.inflight {
            Some((s, ask)) if s == seq => {
                self.apply(ask, granted);
                self.inflight = None;
                true
            }
            _ => false,
        }
    }

    /// What the fleet answered to `asked`: `granted` tokens join the lease, the settled amount is no
    /// longer owed.
    pub fn apply(&mut self, asked: SyncRequest, granted: f64) {
        if self.tokens <= 0.0 && granted > 0.0 {
            self.granted_at = Some(Instant::now());
        }
        self.tokens += granted.max(0.0);
        self.settle -= asked.settle;
    }

    /// Holds tokens granted longer ago than `policy.max_age`.
    pub fn is_aged(&self, now: Instant, policy: &LeasePolicy) -> bool {
        self.tokens > 0.0
            && self
                .granted_at
                .is_some_and(|at| now.saturating_duration_since(at) >= policy.max_age)
    }

    /// Hands every token held back (idle, aged out, shutting down): they are owed at the next sync.
    pub fn release(&mut self) {
        self.settle += self.tokens;
        self.tokens = 0.0;
        self.granted_at = None;
    }

    /// Hands every token back and forgets the demand (idle): an idle key's decaying rate would
    /// otherwise ask for a small lease again at the next sync, and again after each hand-back.
    pub fn retire(&mut self) {
        self.release();
        self.rate = 0.0;
        self.last = None;
    }

    /// Whether the fleet bucket is nearly dry (see the field).
    pub fn set_scarce(&mut self, scarce: bool) {
        self.scarce = scarce;
    }

    /// How long since the last take (forever if none).
    pub fn idle_for(&self, now: Instant) -> Duration {
        self.last
            .map_or(Duration::MAX, |at| now.saturating_duration_since(at))
    }

    /// No take for longer than `policy.idle`.
    pub fn is_idle(&self, now: Instant, policy: &LeasePolicy) -> bool {
        self.last
            .is_none_or(|at| now.saturating_duration_since(at) >= policy.idle)
    }

    /// Tokens held now.
    pub fn held(&self) -> f64 {
        self.tokens
    }

    /// Tokens owed to the fleet (negative: debt).
    pub fn owed(&self) -> f64 {
        self.settle
    }

    /// The recent demand, tokens per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The lease's size: the demand of one horizon, at least `need`, at most the share of the
    /// capacity (unless `need` alone is more).
    fn target(&self, capacity: f64, need: f64, policy: &LeasePolicy) -> f64 {
        if self.scarce {
            return need;
        }
        let demand = self.rate * policy.horizon.as_secs_f64();
        demand.min(capacity * policy.max_share).max(need)
    }

    fn observe(&mut self, amount: f64, now: Instant, policy: &LeasePolicy) {
        let tau = policy.horizon.as_secs_f64().max(1e-3);
        let dt = self
            .last
            .map_or(0.0, |at| now.saturating_duration_since(at).as_secs_f64());
        self.rate = self.rate * (-dt / tau).exp() + amount / tau;
        self.last = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A lease that has seen 10 tokens every 10 ms for a second (about 1,000 tokens/s of demand).
    fn busy(p: &LeasePolicy, t0: Instant) -> Lease {
        let mut l = Lease::default();
        for i in 0..100 {
            l.take(10.0, t0 + ms(10 * i), p);
        }
        l
    }

    #[test]
    fn takes_what_it_holds_and_refuses_the_rest() {
        let p = LeasePolicy::default();
        let now = Instant::now();
        let mut l = Lease::default();
        assert!(!l.take(10.0, now, &p), "an empty lease serves nothing");
        let ask = l.sync_request(1000.0, 10.0, &p);
        assert!(ask.want >= 10.0, "{ask:?}");
        l.apply(ask, 40.0);
        assert!(l.take(30.0, now, &p));
        assert!(!l.take(30.0, now, &p), "10 left");
        assert_eq!(l.held(), 10.0);
    }

    #[test]
    fn the_lease_grows_with_demand_up_to_its_share() {
        let p = LeasePolicy::default();
        let t0 = Instant::now();
        let mut l = Lease::default();
        l.apply(l.sync_request(100_000.0, 0.0, &p), 1_000_000.0);
        // 100 tokens every 10 ms: 10,000 tokens per second.
        for i in 0..300 {
            l.take(100.0, t0 + ms(10 * i), &p);
        }
        assert!(
            (l.rate() - 10_000.0).abs() < 1_000.0,
            "rate {} tokens/s",
            l.rate()
        );
        let mut empty = l.clone();
        empty.release();
        // A horizon of that demand, but never more than a tenth of the capacity.
        let ask = empty.sync_request(1_000_000.0, 0.0, &p);
        assert!((ask.want - 10_000.0).abs() < 1_000.0, "{ask:?}");
        let ask = empty.sync_request(20_000.0, 0.0, &p);
        assert_eq!(ask.want, 2_000.0, "capped at the share: {ask:?}");
        // A single request larger than the share is still asked for whole.
        let ask = empty.sync_request(20_000.0, 5_000.0, &p);
        assert_eq!(ask.want, 5_000.0, "{ask:?}");
    }

    #[test]
    fn it_tops_up_only_below_the_low_water_mark() {
        let p = LeasePolicy::default();
        let t0 = Instant::now();
        let mut l = busy(&p, t0);
        // Demand ~1000 tokens/s: target ~1000 (a tenth of 10,000 is the cap).
        l.apply(l.sync_request(10_000.0, 0.0, &p), 1_000.0);
        assert_eq!(l.sync_request(10_000.0, 0.0, &p).want, 0.0, "full");
        l.take(600.0, t0 + ms(1_000), &p);
        assert!(l.sync_request(10_000.0, 0.0, &p).want > 0.0, "below half");
    }

    #[test]
    fn refunds_debt_and_released_tokens_are_settled_once() {
        let p = LeasePolicy::default();
        let now = Instant::now();
        let mut l = Lease::default();
        l.apply(l.sync_request(1000.0, 100.0, &p), 100.0);
        l.settle(30.0); // a refund from on_complete
        l.settle(-50.0); // a request that used more than it was charged
        l.release();
        let ask = l.sync_request(1000.0, 0.0, &p);
        assert_eq!(ask.settle, 80.0, "100 held - 50 + 30");
        l.apply(ask, 0.0);
        assert_eq!(l.owed(), 0.0, "settled once");
        assert_eq!(l.held(), 0.0);
        assert!(l.is_idle(now + p.idle, &p), "never taken from: idle");
    }

    #[test]
    fn an_idle_lease_goes_back_and_asks_for_nothing_more() {
        let p = LeasePolicy::default();
        let t0 = Instant::now();
        let mut l = busy(&p, t0);
        l.apply(l.sync_request(10_000.0, 0.0, &p), 1_000.0);
        let later = t0 + ms(1_000) + p.idle;
        assert!(l.is_idle(later, &p));
        l.retire();
        let ask = l.sync_request(10_000.0, 0.0, &p);
        assert_eq!((ask.want, ask.settle), (0.0, 1_000.0), "{ask:?}");
        l.apply(ask, 0.0);
        assert_eq!(l.begin_sync(10_000.0, 0.0, &p), None, "nothing to sync");
        assert!(l.is_idle(later, &p), "still idle: can be forgotten");
    }

    #[test]
    fn a_scarce_fleet_bucket_gets_no_reserve_taken() {
        let p = LeasePolicy::default();
        let t0 = Instant::now();
        let mut l = busy(&p, t0);
        assert!(l.sync_request(10_000.0, 0.0, &p).want > 0.0, "a reserve");
        l.set_scarce(true);
        assert_eq!(l.sync_request(10_000.0, 0.0, &p).want, 0.0, "no reserve");
        assert_eq!(
            l.sync_request(10_000.0, 30.0, &p).want,
            30.0,
            "what a take needs"
        );
    }

    #[test]
    fn a_sync_whose_answer_was_lost_is_sent_again_unchanged_and_applied_once() {
        let p = LeasePolicy::default();
        let mut l = Lease::default();
        l.settle(25.0);
        let (seq, ask) = l.begin_sync(1000.0, 10.0, &p).expect("something to sync");
        // No answer (a timeout); meanwhile another refund.
        l.settle(5.0);
        assert_eq!(
            l.begin_sync(1000.0, 10.0, &p),
            Some((seq, ask)),
            "the same sync again"
        );
        assert!(l.finish_sync(seq, 10.0));
        assert!(!l.finish_sync(seq, 10.0), "a second answer is not applied");
        assert_eq!(l.held(), 10.0);
        assert_eq!(l.owed(), 5.0, "the later refund is still owed");
        let (next, _) = l.begin_sync(1000.0, 0.0, &p).expect("the 5 to settle");
        assert_eq!(next, seq + 1);
    }
}
