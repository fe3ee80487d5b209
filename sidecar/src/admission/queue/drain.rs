//! The Retry-After model: how long the work ahead of a request takes to drain, measured in tokens
//! (those charged to the requests in service and waiting, and to clients told to come back) over
//! the token throughput measured per slot; and how many requests run at once (`lanes`). An arrival
//! whose estimated wait already passes its deadline is refused by it rather than left to time out.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::{Admission, Claim, State, EWMA_ALPHA, INITIAL_SERVICE_SECONDS};
use crate::error::GateError;

/// Upper bound of any Retry-After we hand out.
pub(super) const MAX_RETRY_AFTER_SECONDS: u64 = 3600;

/// What the work ahead of a request costs in time, measured in tokens: the tokens charged to the
/// requests in service and waiting, plus those of clients told to come back (so the clients of one
/// burst are not all sent back for the same second), scaled by how much of a charge requests really
/// use, divided by the measured token throughput.
#[derive(Default)]
pub(super) struct Drain {
    /// Tokens charged (claim costs) to the requests in service.
    pub(super) in_service: f64,
    /// Tokens per second one slot delivers (prompt + completion over the time from forwarding to the
    /// end of the response), EWMA over completed requests that reported usage.
    pub(super) rate: Option<f64>,
    /// Used / charged tokens, EWMA over the same requests (a reservation is an upper bound).
    pub(super) fill: Option<f64>,
    /// Charged tokens of clients given a Retry-After, not yet due back, and when that was updated.
    pub(super) returning: f64,
    pub(super) returning_at: Option<Instant>,
    /// How far one request's throughput strays from `rate`: EWMA of `|sample / rate - 1|`. On a real
    /// llama-server it moves with the machine's load; Retry-After leaves that much room.
    pub(super) spread: f64,
    /// Clients told to come back, by the whole second they are due.
    pub(super) calendar: Calendar,
    /// Requests served to the end since start: how many the estimates are measured from.
    pub(super) measured: u32,
}

/// Requests measured before the queue's own timeout may refuse a wait as doomed: one request is no
/// measure of the server (a slow grammar's, as the first sample, made a wait of three seconds read
/// as twenty minutes). A request's own deadline, and a model's load, are held to from the start.
pub(super) const MEASURED_TO_REFUSE: u32 = 3;

/// Clients told to come back, by the whole second (since `epoch`) they are due: no second gets more
/// of them than there are queue places, or the later ones would find it full.
///
/// Bookings lapse like the places kept for them (`returns`): a second is forgotten once it has
/// passed, and the calendar holds at most a bounded number of bookings, the oldest dropped first.
/// So a flood of clients that never come back cannot fill an hour of seconds, and finding the first
/// second with room is one descent into the tree and a walk over at most `most / places` full
/// seconds after it.
#[derive(Default)]
pub(super) struct Calendar {
    /// Clients due, by second.
    due: BTreeMap<u64, usize>,
    /// The seconds booked, in the order they were booked (the oldest booking first).
    order: VecDeque<u64>,
    epoch: Option<Instant>,
}

impl Calendar {
    /// Books a return `secs` from `now`, moved later while that second already has `places` clients
    /// due (at most to `max`); keeps at most `most` bookings. Returns the seconds to tell the client.
    pub(super) fn book(
        &mut self,
        now: Instant,
        secs: u64,
        places: usize,
        max: u64,
        most: usize,
    ) -> u64 {
        let epoch = *self.epoch.get_or_insert(now);
        let base = now.saturating_duration_since(epoch).as_secs();
        // Seconds already past need no booking.
        while let Some(past) = self.due.first_entry().filter(|e| *e.key() < base) {
            past.remove();
        }
        while self.order.front().is_some_and(|s| *s < base) {
            self.order.pop_front();
        }
        let mut at = base + secs;
        for (second, n) in self.due.range(at..) {
            if *second != at || *n < places || at >= base + max {
                break;
            }
            at += 1;
        }
        *self.due.entry(at).or_default() += 1;
        self.order.push_back(at);
        while self.order.len() > most.max(1) {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(n) = self.due.get_mut(&oldest) {
                *n -= 1;
                if *n == 0 {
                    self.due.remove(&oldest);
                }
            }
        }
        at - base
    }
}

impl Drain {
    /// Seconds for `ahead` charged tokens to drain through `lanes` slots working at once, once a
    /// throughput is known.
    pub(super) fn seconds(&self, ahead: f64, lanes: f64) -> Option<f64> {
        let rate = self.rate.filter(|r| *r > 0.0)?;
        Some(ahead * self.fill.unwrap_or(1.0) / (rate * lanes))
    }

    /// [`Drain::seconds`] with room for the measured spread of throughput (at most doubled): a
    /// client told to come back should find the work ahead drained even if it runs slower than usual.
    pub(super) fn cautious_seconds(&self, ahead: f64, lanes: f64) -> Option<f64> {
        Some(self.seconds(ahead, lanes)? * (1.0 + self.spread.min(1.0)))
    }

    /// Ages the returning clients' tokens by the drain rate since they were last counted.
    pub(super) fn decay(&mut self, now: Instant, lanes: f64) {
        if let (Some(at), Some(rate)) = (self.returning_at, self.rate) {
            let per_second = rate * lanes / self.fill.unwrap_or(1.0).max(1e-6);
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            self.returning = (self.returning - elapsed * per_second).max(0.0);
        }
        self.returning_at = Some(now);
    }

    /// A request that held `slots` used `used` of the `charged` tokens in `seconds`.
    pub(super) fn learn(&mut self, charged: u64, used: u64, seconds: f64, slots: usize) {
        if used == 0 || seconds <= 0.0 {
            return;
        }
        let ewma = |old: Option<f64>, sample: f64| {
            Some(old.map_or(sample, |avg| avg + EWMA_ALPHA * (sample - avg)))
        };
        // Per slot: a request on two slots delivers about twice one slot's tokens.
        let sample = used as f64 / seconds / slots.max(1) as f64;
        if let Some(rate) = self.rate.filter(|r| *r > 0.0) {
            let off = (sample / rate - 1.0).abs();
            self.spread += EWMA_ALPHA * (off - self.spread);
        }
        self.rate = ewma(self.rate, sample);
        if charged > 0 {
            self.fill = ewma(self.fill, (used as f64 / charged as f64).min(1.0));
        }
    }
}

/// How much of the work runs at once (see [`Admission::lanes`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Lanes {
    pub(super) requests: f64,
    pub(super) slots: f64,
}

impl Admission {
    /// Seconds until the work ahead of a newcomer has drained: by tokens once a throughput has been
    /// measured, else `(busy + queued) * service_ewma / slots`.
    pub(super) fn wait_seconds(&self, st: &State) -> f64 {
        let now = Instant::now();
        self.own_wait_seconds(st, now) + self.behind_turns(now)
    }

    /// [`Admission::wait_seconds`] of this pool alone: its work and its load, not the other models'
    /// turns (what its seat in the turns tells the others).
    pub(super) fn own_wait_seconds(&self, st: &State, now: Instant) -> f64 {
        let lanes = self.lanes(st);
        let drain = st
            .drain
            .seconds(self.tokens_ahead(st), lanes.slots)
            .unwrap_or_else(|| {
                (st.serving + st.waiters.len()) as f64
                    * st.service_ewma.unwrap_or(INITIAL_SERVICE_SECONDS)
                    / lanes.requests
            });
        drain + self.until_loaded(st, now)
    }

    /// Seconds until the pool may serve: its model loaded, and the other models' turns that come
    /// first done; 0 when it serves now.
    pub(super) fn until_ready(&self, st: &State, now: Instant) -> f64 {
        self.until_loaded(st, now) + self.behind_turns(now)
    }

    /// Seconds until a paused pool is expected to serve (its model loaded); 0 when it serves.
    fn until_loaded(&self, st: &State, now: Instant) -> f64 {
        match (st.paused, st.ready_at) {
            (true, Some(at)) => at.saturating_duration_since(now).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// While the models take turns: until the other models' work now in service and waiting is
    /// done (a new arrival comes after all of it).
    fn behind_turns(&self, now: Instant) -> f64 {
        self.shared.turn.get().map_or(0.0, |seat| seat.ahead(now))
    }

    /// What runs at once, on average, of the work in service and waiting: all the slots, or fewer
    /// when the pool holds fewer of its reservations; as requests (a request on several slots is
    /// one) and as slots (the drain rate is measured per slot).
    pub(super) fn lanes(&self, st: &State) -> Lanes {
        let slots = self.slots() as f64;
        let waiting = st.waiters.values().map(|w| &w.claim);
        let (n, held_slots, kv) = waiting.fold((st.serving, st.busy, st.kv), |(n, s, kv), c| {
            let h = self.hold_of(c);
            (n + 1, s + h.slots, kv + h.kv)
        });
        if n == 0 {
            return Lanes {
                requests: slots,
                slots,
            };
        }
        let per_request_slots = (held_slots as f64 / n as f64).max(1.0);
        let by_slots = slots / per_request_slots;
        let by_pool = match self.pool() {
            Some(pool) if kv > 0 => pool as f64 / (kv as f64 / n as f64),
            _ => f64::INFINITY,
        };
        let requests = by_slots.min(by_pool).clamp(1.0, slots);
        Lanes {
            requests,
            slots: requests * per_request_slots,
        }
    }

    /// Charged tokens ahead of a newcomer: in service, waiting, and due back.
    pub(super) fn tokens_ahead(&self, st: &State) -> f64 {
        st.drain.in_service
            + st.waiters
                .values()
                .map(|w| w.claim.cost as f64)
                .sum::<f64>()
            + st.drain.returning
    }

    /// Seconds `claim` would wait if queued now: the work in service plus the waiters that would be
    /// served before it (a smaller `Place`: more urgent; as urgent with an earlier deadline; or of
    /// its own tenant, or of a tenant served no more than its own). `None` until a service time or token rate has been measured: no estimate is no
    /// ground to refuse.
    pub(super) fn wait_before(&self, st: &State, claim: &Claim, now: Instant) -> Option<f64> {
        let first = self.ahead_of(st, claim, now);
        let (ahead, ahead_tokens) = st
            .waiters
            .values()
            .filter(|w| first(w))
            .fold((0, 0.0), |(n, t), w| (n + 1, t + w.claim.cost as f64));
        let (yielding, leaving) = self.yielding_to(st, claim);
        let tokens = (st.drain.in_service - yielding).max(0.0) + ahead_tokens;
        let lanes = self.lanes(st);
        let drain = st.drain.seconds(tokens, lanes.slots).or_else(|| {
            st.service_ewma
                .map(|s| (st.serving.saturating_sub(leaving) + ahead) as f64 * s / lanes.requests)
        });
        // A model still to load: its load time alone is an estimate.
        let ready = self.until_ready(st, now);
        match (drain, ready > 0.0) {
            (Some(d), _) => Some(d + ready),
            (None, true) => Some(ready),
            (None, false) => None,
        }
    }

    /// At arrival (not admitted at once): refuses `claim` when its estimated wait already passes
    /// its deadline: its own (429 `deadline_unreachable`) or, with `reject_doomed`, the queue's
    /// (429 `estimated_wait_too_long`).
    pub(super) fn check_doomed(
        &self,
        st: &mut State,
        claim: &Claim,
        deadline: Instant,
    ) -> Result<(), GateError> {
        // A request's own deadline is always held to: it said how long its answer is worth.
        let own = claim.deadline.filter(|d| *d <= deadline);
        if !self.shared.fairness.reject_doomed && own.is_none() {
            return Ok(());
        }
        let now = Instant::now();
        if own.is_none()
            && st.drain.measured < MEASURED_TO_REFUSE
            && self.until_ready(st, now) <= 0.0
        {
            return Ok(());
        }
        let by = own.unwrap_or(deadline);
        let left = by.saturating_duration_since(now).as_secs_f64();
        if let Some(estimate) = self.wait_before(st, claim, now) {
            if estimate > left {
                let retry_after = self.retry_after(st, claim.cost);
                return Err(match own {
                    Some(_) => GateError::DeadlineUnreachable {
                        estimate: Duration::try_from_secs_f64(estimate).unwrap_or(Duration::MAX),
                        deadline: Duration::try_from_secs_f64(left).unwrap_or_default(),
                        retry_after,
                    },
                    None => GateError::WaitTooLong {
                        estimate: estimate.ceil() as u64,
                        limit: left.ceil() as u64,
                        retry_after,
                    },
                });
            }
        }
        Ok(())
    }

    /// When a client turned away should find room: the wait for the work ahead (see
    /// [`Admission::wait_seconds`]), at most 3600 s, unrounded (`Retry-After` rounds it up to whole
    /// seconds, `retry-after-ms` keeps it). The client's own `cost` then counts as coming back, so the
    /// next client turned away is told a later time; a whole second already full of returning
    /// clients moves the estimate on by whole seconds.
    pub(super) fn retry_after(&self, st: &mut State, cost: u64) -> Duration {
        let now = Instant::now();
        let lanes = self.lanes(st).slots;
        st.drain.decay(now, lanes);
        let ahead = self.tokens_ahead(st);
        let wait = st
            .drain
            .cautious_seconds(ahead, lanes)
            .map(|w| w + self.until_ready(st, now))
            .unwrap_or_else(|| self.wait_seconds(st));
        let secs = (wait.ceil() as u64).clamp(1, MAX_RETRY_AFTER_SECONDS);
        let exact = Duration::try_from_secs_f64(wait.min(MAX_RETRY_AFTER_SECONDS as f64))
            .unwrap_or(Duration::from_secs(secs));
        // Once a throughput is known, the client's tokens count as coming back; before, there are
        // no tokens to count them in, and only the calendar below spreads them.
        if st.drain.rate.is_some() {
            st.drain.returning += cost as f64;
        }
        // Clients told the same second come back at the same instant, under overload to busy
        // slots: only the queue's places are there for them then (see `returns`). So also before
        // anything is measured, when every client of a burst is told the same estimate.
        let places = match self.shared.capacity {
            0 => self.slots(),
            places => places,
        };
        let most = self.most_bookings();
        let booked = st
            .drain
            .calendar
            .book(now, secs, places, MAX_RETRY_AFTER_SECONDS, most);
        exact + Duration::from_secs(booked - secs)
    }
}
