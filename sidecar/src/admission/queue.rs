//! Slots, the KV pool they may share, and the bounded queue in front of them. A request holds as
//! many slots as llama-server runs tasks for it, and, where the slots share one pool, the tokens it
//! reserves there; it is admitted when both fit beside what is in service. What a finished request
//! gives back goes straight to the next waiters under the same lock, so no newcomer can overtake
//! the queue. The next waiter is:
//!
//! 1. the most urgent by *effective* priority: its priority, improved by one level for every
//!    `aging` it has waited, so a less urgent request still runs once it has waited long enough;
//! 2. among those, the one whose tenant has the lowest virtual token counter (see [`super::fair`]):
//!    tenants share the slots by tokens served, whoever sends more;
//! 3. among those, the first to arrive (so each tenant's own requests keep their order).
//!
//! The next waiter is served first even when a smaller one behind it would fit now: it waits until
//! enough is free, and nobody overtakes it (a large request is never starved by small ones).
//!
//! A full queue rejects instead of growing: a tenant within its share of the queue takes the place of
//! the newest waiter of a tenant beyond it, else a strictly more urgent arrival displaces the least
//! urgent, most recent waiter. A tenant already holding its share is turned away while other tenants
//! are active; alone, it may use the whole queue.
//!
//! Everything that must be given back is given back by a `Drop`: a [`SlotGuard`] releases (or hands
//! on) its slot and ends its tenant's service, and a waiting [`Ticket`] that is dropped (client gone,
//! deadline) leaves the queue.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::claim::Claim;
use super::fair::Tenants;
use crate::error::GateError;
use crate::metrics::{self as m, BoundedLabels};

/// Weight of the newest sample in the service-time average.
const EWMA_ALPHA: f64 = 0.2;
/// Assumed service time until the first request has been measured.
const INITIAL_SERVICE_SECONDS: f64 = 1.0;
/// Upper bound of any Retry-After we hand out.
const MAX_RETRY_AFTER_SECONDS: u64 = 3600;
/// Distinct tenants with their own `slotgate_tenant_tokens_total` series; the rest share `other`.
const TENANT_LABELS: usize = 50;

#[derive(Clone)]
pub struct Admission {
    shared: Arc<Shared>,
}

/// How the queue shares itself between tenants and priorities.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fairness {
    /// A waiter's priority improves by one level for every `aging` it has waited; `None`: never.
    pub aging: Option<Duration>,
    /// The most waiters one tenant may hold; `None`: no limit but the queue's.
    pub tenant_limit: Option<usize>,
    /// Refuse at arrival a request whose estimated wait already passes its deadline (429
    /// `estimated_wait_too_long`) rather than let it wait for a 504.
    pub reject_doomed: bool,
}

struct Shared {
    /// Changes only through [`Admission::set_slots`] (`--slots auto` following llama-server).
    slots: AtomicUsize,
    /// Tokens of the KV pool the slots share; 0: each slot has a context of its own (not limited
    /// here). Changes through [`Admission::set_pool`].
    pool: AtomicU64,
    capacity: usize,
    fairness: Fairness,
    state: Mutex<State>,
}

struct State {
    /// Slots held by the requests in service.
    busy: usize,
    /// Requests in service.
    serving: usize,
    /// Pool tokens held by the requests in service.
    kv: u64,
    /// Keyed by arrival sequence.
    waiters: BTreeMap<u64, Waiter>,
    tenants: Tenants,
    labels: BoundedLabels,
    next_seq: u64,
    closed: bool,
    service_ewma: Option<f64>,
    /// The token model of the drain: see [`Drain`].
    drain: Drain,
}

/// What the work ahead of a request costs in time, measured in tokens: the tokens charged to the
/// requests in service and waiting, plus those of clients told to come back (so the clients of one
/// burst are not all sent back for the same second), scaled by how much of a charge requests really
/// use, divided by the measured token throughput.
#[derive(Default)]
struct Drain {
    /// Tokens charged (claim costs) to the requests in service.
    in_service: f64,
    /// Tokens per second one slot delivers (prompt + completion over the time from forwarding to the
    /// end of the response), EWMA over completed requests that reported usage.
    rate: Option<f64>,
    /// Used / charged tokens, EWMA over the same requests (a reservation is an upper bound).
    fill: Option<f64>,
    /// Charged tokens of clients given a Retry-After, not yet due back, and when that was updated.
    returning: f64,
    returning_at: Option<Instant>,
    /// How far one request's throughput strays from `rate`: EWMA of `|sample / rate - 1|`. On a real
    /// llama-server it moves with the machine's load; Retry-After leaves that much room.
    spread: f64,
    /// Clients told to come back, by the whole second (since `epoch`) they are due: no second gets
    /// more of them than there are places (slots + queue), or the later ones would find it full.
    calendar: BTreeMap<u64, usize>,
    epoch: Option<Instant>,
}

impl Drain {
    /// Seconds for `ahead` charged tokens to drain through `lanes` slots working at once, once a
    /// throughput is known.
    fn seconds(&self, ahead: f64, lanes: f64) -> Option<f64> {
        let rate = self.rate.filter(|r| *r > 0.0)?;
        Some(ahead * self.fill.unwrap_or(1.0) / (rate * lanes))
    }

    /// [`Drain::seconds`] with room for the measured spread of throughput (at most doubled): a
    /// client told to come back should find the work ahead drained even if it runs slower than usual.
    fn cautious_seconds(&self, ahead: f64, lanes: f64) -> Option<f64> {
        Some(self.seconds(ahead, lanes)? * (1.0 + self.spread.min(1.0)))
    }

    /// Books a return `secs` from `now`, moved later while that second already has `places` clients
    /// due. Returns the seconds to tell the client.
    fn book(&mut self, now: Instant, secs: u64, places: usize, max: u64) -> u64 {
        let epoch = *self.epoch.get_or_insert(now);
        let base = now.saturating_duration_since(epoch).as_secs();
        // Seconds already past need no booking.
        self.calendar = self.calendar.split_off(&base);
        let mut secs = secs;
        while secs < max
            && self
                .calendar
                .get(&(base + secs))
                .is_some_and(|n| *n >= places)
        {
            secs += 1;
        }
        *self.calendar.entry(base + secs).or_default() += 1;
        secs
    }

    /// Ages the returning clients' tokens by the drain rate since they were last counted.
    fn decay(&mut self, now: Instant, lanes: f64) {
        if let (Some(at), Some(rate)) = (self.returning_at, self.rate) {
            let per_second = rate * lanes / self.fill.unwrap_or(1.0).max(1e-6);
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            self.returning = (self.returning - elapsed * per_second).max(0.0);
        }
        self.returning_at = Some(now);
    }

    /// A request that held `slots` used `used` of the `charged` tokens in `seconds`.
    fn learn(&mut self, charged: u64, used: u64, seconds: f64, slots: usize) {
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

struct Waiter {
    claim: Claim,
    queued: Instant,
    tx: oneshot::Sender<Grant>,
}

/// What a waiter is told when it leaves the queue other than by timing out.
#[derive(Debug)]
enum Grant {
    /// Its slots (and pool tokens) are taken for it: this many.
    Slot(Hold),
    Displaced {
        retry_after: Duration,
    },
    /// Its tenant held more than its share of a full queue, and another tenant needed the place.
    OverShare {
        waiting: usize,
        retry_after: Duration,
    },
    ShuttingDown {
        retry_after: u64,
    },
}

/// How much of the work runs at once (see [`Admission::lanes`]).
#[derive(Debug, Clone, Copy)]
struct Lanes {
    requests: f64,
    slots: f64,
}

/// What one request in service holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hold {
    slots: usize,
    kv: u64,
}

/// A point-in-time view for /status and for Retry-After.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueStats {
    pub slots: usize,
    /// Slots held by the requests in service.
    pub busy: usize,
    /// Requests in service.
    pub serving: usize,
    /// KV pool tokens they hold, and the pool (`None`: a context per slot).
    pub kv_reserved: u64,
    pub kv_pool: Option<u64>,
    pub depth: usize,
    pub capacity: usize,
    pub tenant_limit: Option<usize>,
    pub service_seconds: f64,
    /// Estimated wait for a request queued now (see `Admission::wait_seconds`).
    pub wait_seconds: f64,
    pub closed: bool,
    /// Tokens reserved (claim costs) by the requests in service.
    pub tokens_in_service: f64,
}

impl QueueStats {
    /// Seconds until the work already admitted (in service and waiting) has drained.
    pub fn drain_seconds(&self) -> f64 {
        self.wait_seconds
    }
}

/// One tenant's share of the queue, for /status.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantStats {
    pub tenant: String,
    /// Virtual tokens: tokens served divided by weight, including charges of requests in service.
    pub counter: f64,
    pub waiting: usize,
    pub in_service: usize,
}

impl Admission {
    pub fn new(slots: usize, capacity: usize) -> Self {
        Self::with_fairness(slots, capacity, Fairness::default())
    }

    pub fn with_fairness(slots: usize, capacity: usize, fairness: Fairness) -> Self {
        Admission {
            shared: Arc::new(Shared {
                slots: AtomicUsize::new(slots),
                pool: AtomicU64::new(0),
                capacity,
                fairness,
                state: Mutex::new(State {
                    busy: 0,
                    serving: 0,
                    kv: 0,
                    waiters: BTreeMap::new(),
                    tenants: Tenants::default(),
                    labels: BoundedLabels::new(TENANT_LABELS),
                    next_seq: 0,
                    closed: false,
                    service_ewma: None,
                    drain: Drain::default(),
                }),
            }),
        }
    }

    /// Waits for a slot until `deadline`. Returns the slot and how long the request queued.
    ///
    /// Cancel-safe: dropping the future while queued removes the waiter at once, and a slot granted
    /// in the same instant is handed on rather than lost.
    pub async fn acquire(
        &self,
        claim: Claim,
        deadline: Instant,
    ) -> Result<(SlotGuard, Duration), GateError> {
        match self.enter(claim, deadline)? {
            Entry::Admitted(slot) => Ok((slot, Duration::ZERO)),
            Entry::Queued(mut ticket) => ticket.wait(deadline).await,
        }
    }

    /// A slot at once when one is free and nobody waits, else a place in the queue (or the refusal:
    /// full, doomed, over the tenant's share, shutting down). The caller may use the time queued
    /// (e.g. to count the prompt and [`Ticket::recost`]) before it [`Ticket::wait`]s.
    pub fn enter(&self, claim: Claim, deadline: Instant) -> Result<Entry, GateError> {
        let mut st = self.lock();
        if st.closed {
            return Err(GateError::ShuttingDown { retry_after: 1 });
        }
        if st.waiters.is_empty() && self.fits(&st, &claim) {
            let hold = self.hold_of(&claim);
            self.take(&mut st, hold, claim.cost);
            st.tenants.admit(&claim.tenant, claim.charge());
            self.publish(&st);
            return Ok(Entry::Admitted(self.guard(&claim, hold)));
        }
        if self.shared.fairness.reject_doomed {
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now).as_secs_f64();
            if let Some(estimate) = self.wait_before(&st, &claim, now) {
                if estimate > left {
                    return Err(GateError::WaitTooLong {
                        estimate: estimate.ceil() as u64,
                        limit: left.ceil() as u64,
                        retry_after: self.retry_after(&mut st, claim.cost),
                    });
                }
            }
        }
        if let Some(limit) = self.shared.fairness.tenant_limit {
            // Alone, a tenant may use the whole queue; beside others, only its share.
            let waiting = st.tenants.waiting(&claim.tenant);
            if waiting >= limit && st.tenants.others_active(&claim.tenant) {
                return Err(GateError::TenantQueueFull {
                    waiting,
                    retry_after: self.retry_after(&mut st, claim.cost),
                });
            }
        }
        if st.waiters.len() >= self.shared.capacity {
            let now = Instant::now();
            if let Some(seq) = self.over_share_victim(&st, &claim, now) {
                // A tenant beyond its share gives up its newest place to one within its share.
                if let Some(w) = st.waiters.remove(&seq) {
                    let waiting = st.tenants.waiting(&w.claim.tenant);
                    st.tenants.dequeue(&w.claim.tenant);
                    let retry_after = self.retry_after(&mut st, w.claim.cost);
                    let _ = w.tx.send(Grant::OverShare {
                        waiting,
                        retry_after,
                    });
                }
            } else {
                let victim = st
                    .waiters
                    .iter()
                    .map(|(seq, w)| (self.effective(w, now), *seq))
                    .max();
                match victim {
                    // Strictly more urgent: the least urgent, most recently queued waiter gives way.
                    Some((urgency, seq)) if claim.priority < urgency => {
                        if let Some(w) = st.waiters.remove(&seq) {
                            st.tenants.dequeue(&w.claim.tenant);
                            let retry_after = self.retry_after(&mut st, w.claim.cost);
                            let _ = w.tx.send(Grant::Displaced { retry_after });
                        }
                    }
                    _ => {
                        return Err(GateError::QueueFull {
                            depth: st.waiters.len(),
                            retry_after: self.retry_after(&mut st, claim.cost),
                        })
                    }
                }
            }
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        let (tx, rx) = oneshot::channel();
        st.tenants.enqueue(&claim.tenant);
        st.waiters.insert(
            seq,
            Waiter {
                claim: claim.clone(),
                queued: Instant::now(),
                tx,
            },
        );
        self.publish(&st);
        Ok(Entry::Queued(Ticket {
            admission: self.clone(),
            seq,
            claim,
            queued: Instant::now(),
            rx,
            resolved: false,
        }))
    }

    /// On a full queue, the waiter that gives way to `claim` when `claim`'s tenant is within its
    /// share: of the tenant holding the most waiters beyond its share, the least urgent and most
    /// recent one, provided it is not more urgent than `claim`.
    fn over_share_victim(&self, st: &State, claim: &Claim, now: Instant) -> Option<u64> {
        let limit = self.shared.fairness.tenant_limit?;
        if st.tenants.waiting(&claim.tenant) >= limit {
            return None;
        }
        st.waiters
            .iter()
            .filter_map(|(seq, w)| {
                let held = st.tenants.waiting(&w.claim.tenant);
                (held > limit).then(|| (held, self.effective(w, now), *seq))
            })
            .max()
            .filter(|(_, urgency, _)| claim.priority <= *urgency)
            .map(|(_, _, seq)| seq)
    }

    /// A waiter's priority after aging: one level more urgent for every `aging` waited.
    fn effective(&self, w: &Waiter, now: Instant) -> i64 {
        let Some(step) = self.shared.fairness.aging else {
            return w.claim.priority;
        };
        let levels = now.saturating_duration_since(w.queued).as_nanos() / step.as_nanos();
        w.claim
            .priority
            .saturating_sub(i64::try_from(levels).unwrap_or(i64::MAX))
    }

    /// The waiter served next: most urgent, then least-served tenant, then first come.
    fn next_waiter(&self, st: &State, now: Instant) -> Option<u64> {
        st.waiters
            .iter()
            .map(|(seq, w)| {
                let counter = st.tenants.counter(&w.claim.tenant);
                (self.effective(w, now), counter, *seq)
            })
            .min_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)))
            .map(|(_, _, seq)| seq)
    }

    /// The slots requests are admitted to now.
    pub fn slots(&self) -> usize {
        self.shared.slots.load(Ordering::Relaxed)
    }

    /// Admits to `n` slots from now on (at least 1). More slots go at once to waiters; with fewer,
    /// requests already in service finish and no new one is admitted until the rest fit.
    pub fn set_slots(&self, n: usize) {
        let mut st = self.lock();
        self.shared.slots.store(n.max(1), Ordering::Relaxed);
        self.dispatch(&mut st);
    }

    /// Tokens of the KV pool the slots share from now on (`None`: each slot its own context).
    /// A larger pool goes at once to waiters; with a smaller one, what is in service finishes.
    pub fn set_pool(&self, tokens: Option<u64>) {
        let mut st = self.lock();
        self.shared
            .pool
            .store(tokens.unwrap_or(0), Ordering::Relaxed);
        self.dispatch(&mut st);
    }

    /// The pool, when the slots share one.
    pub fn pool(&self) -> Option<u64> {
        match self.shared.pool.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// What `claim` holds if admitted now: its slots and pool tokens, neither more than there is
    /// (alone, a request may use the whole server).
    fn hold_of(&self, claim: &Claim) -> Hold {
        Hold {
            slots: claim.slots.clamp(1, self.slots()),
            kv: self.pool().map_or(claim.kv, |p| claim.kv.min(p)),
        }
    }

    /// Whether `claim` can be admitted beside what is in service.
    fn fits(&self, st: &State, claim: &Claim) -> bool {
        if st.serving == 0 {
            return true;
        }
        let hold = self.hold_of(claim);
        st.busy + hold.slots <= self.slots() && self.pool().is_none_or(|p| st.kv + hold.kv <= p)
    }

    /// Counts `hold` (of a request charged `cost`) as in service.
    fn take(&self, st: &mut State, hold: Hold, cost: u64) {
        st.busy += hold.slots;
        st.kv += hold.kv;
        st.serving += 1;
        st.drain.in_service += cost as f64;
    }

    /// Turns every waiter away and refuses new ones; slots already held drain normally.
    pub fn close(&self, retry_after: u64) {
        let mut st = self.lock();
        st.closed = true;
        for (_, w) in std::mem::take(&mut st.waiters) {
            st.tenants.dequeue(&w.claim.tenant);
            let _ = w.tx.send(Grant::ShuttingDown { retry_after });
        }
        self.publish(&st);
    }

    /// Whether the queue was closed (shutting down).
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    pub fn stats(&self) -> QueueStats {
        self.stats_of(&self.lock())
    }

    fn stats_of(&self, st: &State) -> QueueStats {
        QueueStats {
            slots: self.slots(),
            busy: st.busy,
            serving: st.serving,
            kv_reserved: st.kv,
            kv_pool: self.pool(),
            depth: st.waiters.len(),
            capacity: self.shared.capacity,
            tenant_limit: self.shared.fairness.tenant_limit,
            service_seconds: st.service_ewma.unwrap_or(INITIAL_SERVICE_SECONDS),
            wait_seconds: self.wait_seconds(st),
            closed: st.closed,
            tokens_in_service: st.drain.in_service,
        }
    }

    /// Seconds until the work ahead of a newcomer has drained: by tokens once a throughput has been
    /// measured, else `(busy + queued) * service_ewma / slots`.
    fn wait_seconds(&self, st: &State) -> f64 {
        let lanes = self.lanes(st);
        st.drain
            .seconds(self.tokens_ahead(st), lanes.slots)
            .unwrap_or_else(|| {
                (st.serving + st.waiters.len()) as f64
                    * st.service_ewma.unwrap_or(INITIAL_SERVICE_SECONDS)
                    / lanes.requests
            })
    }

    /// What runs at once, on average, of the work in service and waiting: all the slots, or fewer
    /// when the pool holds fewer of its reservations; as requests (a request on several slots is
    /// one) and as slots (the drain rate is measured per slot).
    fn lanes(&self, st: &State) -> Lanes {
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
    fn tokens_ahead(&self, st: &State) -> f64 {
        st.drain.in_service
            + st.waiters
                .values()
                .map(|w| w.claim.cost as f64)
                .sum::<f64>()
            + st.drain.returning
    }

    /// Seconds `claim` would wait if queued now: the work in service plus the waiters that would be
    /// served before it (more urgent; as urgent and of its own tenant, or of a tenant served no more
    /// than its own). `None` until a service time or token rate has been measured: no estimate is no
    /// ground to refuse.
    fn wait_before(&self, st: &State, claim: &Claim, now: Instant) -> Option<f64> {
        let mine = st.tenants.counter(&claim.tenant);
        let first = |w: &Waiter| {
            let p = self.effective(w, now);
            p < claim.priority
                || (p == claim.priority
                    && (w.claim.tenant == claim.tenant
                        || st.tenants.counter(&w.claim.tenant) <= mine))
        };
        let (ahead, ahead_tokens) = st
            .waiters
            .values()
            .filter(|w| first(w))
            .fold((0, 0.0), |(n, t), w| (n + 1, t + w.claim.cost as f64));
        let tokens = st.drain.in_service + ahead_tokens;
        let lanes = self.lanes(st);
        st.drain.seconds(tokens, lanes.slots).or_else(|| {
            st.service_ewma
                .map(|s| (st.serving + ahead) as f64 * s / lanes.requests)
        })
    }

    /// The tenants the scheduler knows (active, or remembered for a counter above the others'), the
    /// next to be served first, at most `limit`.
    pub fn tenants(&self, limit: usize) -> Vec<TenantStats> {
        let st = self.lock();
        let mut all: Vec<TenantStats> = st
            .tenants
            .iter()
            .map(|(name, t)| TenantStats {
                tenant: name.to_owned(),
                counter: t.counter,
                waiting: t.waiting,
                in_service: t.in_service,
            })
            .collect();
        drop(st);
        all.sort_by(|a, b| {
            a.counter
                .total_cmp(&b.counter)
                .then_with(|| a.tenant.cmp(&b.tenant))
        });
        all.truncate(limit);
        all
    }

    /// When a client turned away should find room: the wait for the work ahead (see
    /// [`Admission::wait_seconds`]), at most 3600 s, unrounded (`Retry-After` rounds it up to whole
    /// seconds, `retry-after-ms` keeps it). The client's own `cost` then counts as coming back, so the
    /// next client turned away is told a later time; a whole second already full of returning
    /// clients moves the estimate on by whole seconds.
    fn retry_after(&self, st: &mut State, cost: u64) -> Duration {
        let now = Instant::now();
        let lanes = self.lanes(st).slots;
        st.drain.decay(now, lanes);
        let ahead = self.tokens_ahead(st);
        let wait = st
            .drain
            .cautious_seconds(ahead, lanes)
            .unwrap_or_else(|| self.wait_seconds(st));
        let secs = (wait.ceil() as u64).clamp(1, MAX_RETRY_AFTER_SECONDS);
        let exact = Duration::try_from_secs_f64(wait.min(MAX_RETRY_AFTER_SECONDS as f64))
            .unwrap_or(Duration::from_secs(secs));
        if st.drain.rate.is_none() {
            return exact;
        }
        st.drain.returning += cost as f64;
        let places = self.slots() + self.shared.capacity;
        let booked = st.drain.book(now, secs, places, MAX_RETRY_AFTER_SECONDS);
        exact + Duration::from_secs(booked - secs)
    }

    /// The guard of what `hold` took, already counted as in service and charged to `claim`'s tenant.
    fn guard(&self, claim: &Claim, hold: Hold) -> SlotGuard {
        SlotGuard {
            admission: self.clone(),
            hold,
            started: Instant::now(),
            completed: false,
            tenant: claim.tenant.clone(),
            weight: claim.weight,
            unsettled: Some(claim.charge()),
            cost: claim.cost,
            used: None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-updated in a way that matters
        // more than stopping service would, so keep serving.
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits the next waiters while they fit beside what is in service, in their order.
    fn dispatch(&self, st: &mut State) {
        let now = Instant::now();
        while let Some(seq) = self.next_waiter(st, now) {
            if !st
                .waiters
                .get(&seq)
                .is_some_and(|w| self.fits(st, &w.claim))
            {
                break;
            }
            let Some(w) = st.waiters.remove(&seq) else {
                break;
            };
            let hold = self.hold_of(&w.claim);
            if w.tx.send(Grant::Slot(hold)).is_ok() {
                self.take(st, hold, w.claim.cost);
                st.tenants.promote(&w.claim.tenant, w.claim.charge());
            } else {
                st.tenants.dequeue(&w.claim.tenant);
            }
        }
        self.publish(st);
    }

    fn publish(&self, st: &State) {
        metrics::gauge!(m::QUEUE_DEPTH).set(st.waiters.len() as f64);
        metrics::gauge!(m::SLOTS_BUSY).set(st.busy as f64);
        metrics::gauge!(m::KV_RESERVED_TOKENS).set(st.kv as f64);
    }
}

/// What [`Admission::enter`] gives: a slot now, or a place in the queue.
pub enum Entry {
    Admitted(SlotGuard),
    Queued(Ticket),
}

/// A place in the queue. Dropping it unresolved leaves the queue (and hands on a slot granted meanwhile).
pub struct Ticket {
    admission: Admission,
    seq: u64,
    claim: Claim,
    queued: Instant,
    rx: oneshot::Receiver<Grant>,
    resolved: bool,
}

impl Ticket {
    /// Waits for the slot until `deadline`; returns it and how long the request queued in all.
    ///
    /// Cancel-safe: it may be dropped (e.g. in a `select!`) and called again; dropping the ticket
    /// itself is what leaves the queue.
    pub async fn wait(&mut self, deadline: Instant) -> Result<(SlotGuard, Duration), GateError> {
        let grant = match tokio::time::timeout_at(deadline, &mut self.rx).await {
            Ok(Ok(grant)) => grant,
            // The sender is only dropped unsent by a leaked ticket; treat it like a shutdown.
            Ok(Err(_)) => Grant::ShuttingDown { retry_after: 1 },
            Err(_) => match self.leave() {
                Some(grant) => grant,
                None => return Err(GateError::QueueTimeout(self.queued.elapsed())),
            },
        };
        self.resolved = true;
        match grant {
            // Granted in the same instant as the deadline passed: the promise was "never forwarded
            // after the timeout", so the slot goes straight on to the next waiter.
            Grant::Slot(hold) if Instant::now() > deadline => {
                self.guard(hold).settle(0);
                Err(GateError::QueueTimeout(self.queued.elapsed()))
            }
            Grant::Slot(hold) => Ok((self.guard(hold), self.queued.elapsed())),
            Grant::Displaced { retry_after } => Err(GateError::Displaced { retry_after }),
            Grant::OverShare {
                waiting,
                retry_after,
            } => Err(GateError::TenantQueueFull {
                waiting,
                retry_after,
            }),
            Grant::ShuttingDown { retry_after } => Err(GateError::ShuttingDown { retry_after }),
        }
    }

    /// Replaces the up-front cost of a request still waiting (its prompt was counted while it
    /// waited): what its tenant is charged when it is admitted, and what the wait estimates of those
    /// behind it count. A waiter already granted keeps the cost it was charged; its slot settles
    /// from the real usage.
    pub fn recost(&mut self, cost: u64, slots: usize, kv: u64) {
        let mut st = self.admission.lock();
        if let Some(w) = st.waiters.get_mut(&self.seq) {
            w.claim.cost = cost;
            w.claim.slots = slots;
            w.claim.kv = kv;
            self.claim = w.claim.clone();
            // Smaller now, it may fit already.
            self.admission.dispatch(&mut st);
        }
    }

    /// Leaves the queue. Returns the grant if one arrived before we got the lock.
    fn leave(&mut self) -> Option<Grant> {
        let mut st = self.admission.lock();
        if let Some(w) = st.waiters.remove(&self.seq) {
            st.tenants.dequeue(&w.claim.tenant);
            self.resolved = true;
            self.admission.publish(&st);
            return None;
        }
        drop(st);
        self.rx.try_recv().ok()
    }

    /// What this ticket was granted (already in service and charged when the grant was sent).
    fn guard(&self, hold: Hold) -> SlotGuard {
        self.admission.guard(&self.claim, hold)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.resolved {
            return;
        }
        if let Some(Grant::Slot(hold)) = self.leave() {
            // Never used: nothing was served, and the slot goes on to the next waiter.
            self.guard(hold).settle(0);
        }
    }
}

/// A request's slots (and pool tokens), held until the response has been fully streamed or the
/// client has gone.
pub struct SlotGuard {
    admission: Admission,
    hold: Hold,
    started: Instant,
    completed: bool,
    tenant: Arc<str>,
    weight: f64,
    /// The up-front charge to the tenant, until [`SlotGuard::settle`] replaces it by the real count.
    unsettled: Option<f64>,
    /// Tokens charged up front, and really used once known.
    cost: u64,
    used: Option<u64>,
}

impl SlotGuard {
    /// Marks the request as served in full, so its duration feeds the service-time estimate.
    pub fn complete(&mut self) {
        self.completed = true;
    }

    /// Replaces the tenant's up-front charge by the tokens the request really used: 0 for a request
    /// that never reached the upstream. Once; a request never settled stays charged its estimate.
    pub fn settle(&mut self, actual_tokens: u64) {
        let Some(charged) = self.unsettled.take() else {
            return;
        };
        self.used = Some(actual_tokens);
        let mut st = self.admission.lock();
        st.tenants
            .settle(&self.tenant, charged, actual_tokens as f64 / self.weight);
        if actual_tokens > 0 {
            let label = st.labels.label(&self.tenant);
            drop(st);
            metrics::counter!(m::TENANT_TOKENS_TOTAL, "tenant" => label).increment(actual_tokens);
        }
    }

    /// Releases the slot `after` from now instead of at once: for a request abandoned while its
    /// upstream connection is still being torn down on another task, so the next request does not
    /// reach llama-server before it has noticed. Outside a runtime it is released at once.
    pub fn release_after(self, after: Duration) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                tokio::time::sleep(after).await;
                drop(self);
            });
        }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut st = self.admission.lock();
        st.drain.in_service = (st.drain.in_service - self.cost as f64).max(0.0);
        st.busy = st.busy.saturating_sub(self.hold.slots);
        st.kv = st.kv.saturating_sub(self.hold.kv);
        st.serving = st.serving.saturating_sub(1);
        if self.completed {
            let sample = self.started.elapsed().as_secs_f64();
            st.service_ewma = Some(match st.service_ewma {
                Some(avg) => avg + EWMA_ALPHA * (sample - avg),
                None => sample,
            });
            st.drain
                .learn(self.cost, self.used.unwrap_or(0), sample, self.hold.slots);
        }
        st.tenants
            .finish(&self.tenant, self.unsettled.unwrap_or(0.0));
        self.admission.dispatch(&mut st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    /// One tenant's claim at `priority`.
    fn c(priority: i64) -> Claim {
        Claim::test("t", priority)
    }

    #[tokio::test(start_paused = true)]
    async fn serves_by_priority_then_arrival_and_hands_slots_on() {
        let adm = Admission::new(1, 8);
        let (first, _) = adm.acquire(c(0), far()).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, prio) in [("a5", 5), ("b1", 1), ("c5", 5), ("d1", 1)] {
            let (adm, order) = (adm.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let (slot, _) = adm.acquire(c(prio), far()).await.unwrap();
                order.lock().unwrap().push(name);
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(slot);
            }));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(adm.stats().depth, 4);
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["b1", "d1", "a5", "c5"]);
        let s = adm.stats();
        assert_eq!((s.busy, s.depth), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn more_slots_go_to_waiters_at_once_and_fewer_hold_new_ones_back() {
        let adm = Admission::new(1, 8);
        let (first, _) = adm.acquire(c(0), far()).await.unwrap();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let adm = adm.clone();
                tokio::spawn(async move { adm.acquire(c(0), far()).await.map(|(s, _)| s) })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!((adm.stats().busy, adm.stats().depth), (1, 3));
        adm.set_slots(3);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            (adm.stats().slots, adm.stats().busy, adm.stats().depth),
            (3, 3, 1),
            "two new slots, two waiters served"
        );
        // Down to one: nobody is cut off, and the last waiter goes only once busy < 1.
        adm.set_slots(1);
        let mut held = vec![first];
        let mut done = Vec::new();
        for w in waiters {
            if w.is_finished() {
                held.push(w.await.unwrap().unwrap());
            } else {
                done.push(w);
            }
        }
        assert_eq!(held.len(), 3);
        held.pop();
        held.pop();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(adm.stats().depth, 1, "busy 1 of 1: the waiter still waits");
        held.pop();
        let last = done.pop().unwrap().await.unwrap().unwrap();
        assert_eq!(adm.stats().busy, 1);
        drop(last);
        assert_eq!((adm.stats().busy, adm.stats().depth), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn full_queue_rejects_or_displaces_the_least_urgent_newest() {
        let adm = Admission::new(1, 2);
        let (_held, _) = adm.acquire(c(0), far()).await.unwrap();
        let a = tokio::spawn({
            let adm = adm.clone();
            async move { adm.acquire(c(5), far()).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let b = tokio::spawn({
            let adm = adm.clone();
            async move { adm.acquire(c(5), far()).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let err = adm.acquire(c(5), far()).await.err().unwrap();
        assert!(
            matches!(err, GateError::QueueFull { depth: 2, .. }),
            "{err:?}"
        );
        assert!(err.retry_after().unwrap() >= 1);

        let urgent = tokio::spawn({
            let adm = adm.clone();
            async move { adm.acquire(c(0), far()).await.map(|_| ()) }
        });
        let displaced = b.await.unwrap().err().unwrap();
        assert!(
            matches!(displaced, GateError::Displaced { .. }),
            "{displaced:?}"
        );
        assert_eq!(adm.stats().depth, 2);
        adm.close(1);
        assert!(matches!(
            a.await.unwrap(),
            Err(GateError::ShuttingDown { .. })
        ));
        assert!(matches!(
            urgent.await.unwrap(),
            Err(GateError::ShuttingDown { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_and_cancellation_leave_the_queue() {
        let adm = Admission::new(1, 4);
        let (held, _) = adm.acquire(c(0), far()).await.unwrap();
        let err = adm
            .acquire(c(0), Instant::now() + Duration::from_millis(50))
            .await
            .err()
            .unwrap();
        assert!(matches!(err, GateError::QueueTimeout(_)), "{err:?}");

        let waiting = tokio::spawn({
            let adm = adm.clone();
            async move { adm.acquire(c(0), far()).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(adm.stats().depth, 1);
        waiting.abort();
        let _ = waiting.await;
        assert_eq!(adm.stats().depth, 0);
        drop(held);
        assert_eq!(adm.stats().busy, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_racing_a_cancellation_is_handed_on() {
        let adm = Admission::new(1, 4);
        let (held, _) = adm.acquire(c(0), far()).await.unwrap();
        let Entry::Queued(ticket) = adm.enter(c(0), far()).unwrap() else {
            panic!("expected to queue")
        };
        drop(held); // grants the slot to `ticket`, which never looks at it
        assert_eq!(adm.stats().busy, 1);
        drop(ticket);
        let s = adm.stats();
        assert_eq!((s.busy, s.depth), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_follows_measured_service_time() {
        let adm = Admission::new(1, 1);
        for _ in 0..20 {
            let (mut slot, _) = adm.acquire(c(0), far()).await.unwrap();
            tokio::time::sleep(Duration::from_secs(3)).await;
            slot.complete();
        }
        assert!((adm.stats().service_seconds - 3.0).abs() < 0.01);
        let (_held, _) = adm.acquire(c(0), far()).await.unwrap();
        let _waiting = tokio::spawn({
            let adm = adm.clone();
            async move { adm.acquire(c(0), far()).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let err = adm.acquire(c(0), far()).await.err().unwrap();
        // One busy slot and one waiter ahead, 3 s each.
        assert_eq!(err.retry_after(), Some(6));
    }

    /// Clients turned away are never told to come back in a second that already has as many clients
    /// due as there are places (slots + queue): the later ones would find it full again.
    #[tokio::test(start_paused = true)]
    async fn no_second_gets_more_returning_clients_than_places() {
        let adm = Admission::new(1, 1);
        // Cheap requests: 10 tokens in 10 ms, so the work ahead is far under a second.
        learn(&adm, 10, Duration::from_millis(10), 10).await;
        let (_held, _) = adm.acquire(claim("a", 0, 10), far()).await.unwrap();
        let _waiting = adm.enter(claim("a", 0, 10), far()).unwrap();
        let told: Vec<u64> = (0..6)
            .map(|_| {
                adm.enter(claim("a", 0, 10), far())
                    .err()
                    .and_then(|e| e.retry_after())
                    .unwrap()
            })
            .collect();
        assert_eq!(told, [1, 1, 2, 2, 3, 3]);
    }

    /// A throughput that varies from request to request makes Retry-After leave room for it.
    #[tokio::test(start_paused = true)]
    async fn retry_after_leaves_room_for_a_varying_throughput() {
        let told = |steady: bool| async move {
            let adm = Admission::new(1, 1);
            for i in 0..20u64 {
                let (mut slot, _) = adm.acquire(claim("a", 0, 400), far()).await.unwrap();
                // 400 tokens in 2 s on average; unsteady: 1 s and 3 s in turn.
                let secs = if steady { 2 } else { 1 + 2 * (i % 2) };
                tokio::time::sleep(Duration::from_secs(secs)).await;
                slot.settle(400);
                slot.complete();
            }
            let (_held, _) = adm.acquire(claim("a", 0, 400), far()).await.unwrap();
            let _waiting = adm.enter(claim("a", 0, 400), far()).unwrap();
            adm.enter(claim("a", 0, 400), far())
                .err()
                .and_then(|e| e.retry_after())
                .unwrap()
        };
        let (steady, unsteady) = (told(true).await, told(false).await);
        assert_eq!(steady, 4, "two requests of 2 s ahead");
        assert!(unsteady > steady, "steady {steady}, unsteady {unsteady}");
    }

    /// A request whose estimated wait already passes its deadline is refused at arrival (429 with
    /// Retry-After), not queued to time out; one that can make it, or any request before a service
    /// time has been measured, queues as before.
    #[tokio::test(start_paused = true)]
    async fn a_doomed_wait_is_refused_at_arrival() {
        let fairness = Fairness {
            reject_doomed: true,
            ..Fairness::default()
        };
        let adm = Admission::with_fairness(1, 8, fairness);
        let deadline = |secs| Instant::now() + Duration::from_secs(secs);
        // Nothing measured yet: no ground to refuse.
        let (held, _) = adm.acquire(c(0), far()).await.unwrap();
        let early = adm.enter(c(0), deadline(1)).unwrap();
        drop(early);
        drop(held);
        // 3 s a request.
        for _ in 0..5 {
            let (mut slot, _) = adm.acquire(c(0), far()).await.unwrap();
            tokio::time::sleep(Duration::from_secs(3)).await;
            slot.complete();
        }
        let (_held, _) = adm.acquire(c(0), far()).await.unwrap();
        let first = adm.enter(c(0), deadline(10)).unwrap();
        // One in service and one waiting ahead: ~6 s. A 5 s deadline is doomed, 10 s is not.
        let err = adm.enter(c(0), deadline(5)).err().unwrap();
        assert!(
            matches!(err, GateError::WaitTooLong { estimate: 6, .. }),
            "{err:?}"
        );
        assert_eq!(err.status(), 429);
        assert!(err.retry_after().unwrap() >= 6, "{err:?}");
        let ok = adm.enter(c(0), deadline(10));
        assert!(ok.is_ok());
        // A more urgent request waits only for the one in service.
        let urgent = adm.enter(c(-1), deadline(5));
        assert!(urgent.is_ok());
        // Off: it queues (and would time out).
        let off = Admission::new(1, 8);
        let (_h, _) = off.acquire(c(0), far()).await.unwrap();
        drop(first);
        assert!(off.enter(c(0), deadline(1)).is_ok());
    }

    /// Once requests have reported their usage, Retry-After is the tokens ahead over the measured
    /// token throughput, scaled by how much of a charge is really used; and each client turned away
    /// counts as coming back, so the next one is told a later second.
    #[tokio::test(start_paused = true)]
    async fn retry_after_counts_tokens_ahead_and_spreads_a_burst() {
        let adm = Admission::new(1, 1);
        // Charged 400 tokens each, used 200 in 2 s: 100 tokens/s, half of each charge used.
        learn(&adm, 400, Duration::from_secs(2), 200).await;
        let (_held, _) = adm.acquire(claim("a", 0, 400), far()).await.unwrap();
        let _waiting = tokio::spawn({
            let adm = adm.clone();
            async move { adm.acquire(claim("a", 0, 1000), far()).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        // Ahead: 400 in service + 1000 waiting, half used: 700 tokens at 100/s = 7 s.
        assert!(
            (adm.stats().wait_seconds - 7.0).abs() < 0.01,
            "{:?}",
            adm.stats()
        );
        let told: Vec<u64> = (0..3)
            .map(|_| {
                adm.enter(claim("b", 0, 200), far())
                    .err()
                    .and_then(|e| e.retry_after())
                    .expect("turned away with a Retry-After")
            })
            .collect();
        // Each turned-away client's 200 (100 used) comes back: one second more for the next.
        assert_eq!(told, [7, 8, 9]);
    }

    /// `retry-after-ms` is the estimate itself; `Retry-After` rounds it up. A second already full of
    /// returning clients moves both on by whole seconds.
    #[tokio::test(start_paused = true)]
    async fn retry_after_ms_is_the_unrounded_estimate() {
        let adm = Admission::new(1, 1);
        // 100 tokens/s, half of each charge used (as above).
        learn(&adm, 400, Duration::from_secs(2), 200).await;
        let (_held, _) = adm.acquire(claim("a", 0, 400), far()).await.unwrap();
        let _waiting = adm.enter(claim("a", 0, 500), far()).unwrap();
        let told = |adm: &Admission, cost| {
            let e = adm.enter(claim("b", 0, cost), far()).err().unwrap();
            (e.retry_after().unwrap(), e.retry_after_ms().unwrap())
        };
        // Ahead: (400 + 500) / 2 tokens at 100/s = 4.5 s; then 100 more tokens coming back.
        assert_eq!(told(&adm, 200), (5, 4_500));
        assert_eq!(told(&adm, 200), (6, 5_500));

        // Cheap requests, far under a second: two places, so two clients per second.
        let adm = Admission::new(1, 1);
        learn(&adm, 10, Duration::from_millis(10), 10).await;
        let (_held, _) = adm.acquire(claim("a", 0, 10), far()).await.unwrap();
        let _waiting = adm.enter(claim("a", 0, 10), far()).unwrap();
        let all: Vec<(u64, u64)> = (0..4).map(|_| told(&adm, 10)).collect();
        assert_eq!(all, [(1, 20), (1, 30), (2, 1_040), (2, 1_050)]);
    }

    /// Serves ten requests of tenant `a`, each charged `charge`, taking `took` and using `used`: the
    /// drain rate (and how much of a charge is used) the estimates then go by.
    async fn learn(adm: &Admission, charge: u64, took: Duration, used: u64) {
        for _ in 0..10 {
            let (mut slot, _) = adm.acquire(claim("a", 0, charge), far()).await.unwrap();
            tokio::time::sleep(took).await;
            slot.settle(used);
            slot.complete();
        }
    }

    type Log = Arc<Mutex<Vec<(&'static str, Instant)>>>;

    fn claim(tenant: &str, priority: i64, cost: u64) -> Claim {
        Claim {
            cost,
            ..Claim::test(tenant, priority)
        }
    }

    /// A request for `claim` that logs `tag` when it gets its slot, holds it for `hold`, then settles
    /// `actual` tokens (the charge itself when `None`).
    fn request(
        adm: &Admission,
        log: &Log,
        tag: &'static str,
        claim: Claim,
        hold: Duration,
        actual: Option<u64>,
    ) -> tokio::task::JoinHandle<Result<(), GateError>> {
        let (adm, log) = (adm.clone(), log.clone());
        let actual = actual.unwrap_or(claim.cost);
        tokio::spawn(async move {
            let (mut slot, _) = adm.acquire(claim, far()).await?;
            log.lock().unwrap().push((tag, Instant::now()));
            tokio::time::sleep(hold).await;
            slot.settle(actual);
            Ok(())
        })
    }

    fn tags(log: &Log) -> Vec<&'static str> {
        log.lock().unwrap().iter().map(|(t, _)| *t).collect()
    }

    /// Holds the only slot, queues `queued` (tag, claim, actual tokens) one by one, frees the slot and
    /// returns the order they were served in.
    async fn served_order(
        adm: &Admission,
        queued: Vec<(&'static str, Claim, Option<u64>)>,
    ) -> Vec<&'static str> {
        let log = Log::default();
        let (held, _) = adm.acquire(claim("holder", 0, 1), far()).await.unwrap();
        let mut tasks = Vec::new();
        for (tag, claim, actual) in queued {
            tasks.push(request(
                adm,
                &log,
                tag,
                claim,
                Duration::from_millis(10),
                actual,
            ));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(held);
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let s = adm.stats();
        assert_eq!((s.busy, s.depth), (0, 0));
        tags(&log)
    }

    #[tokio::test(start_paused = true)]
    async fn tenants_take_turns_within_a_priority_each_in_its_own_order() {
        let adm = Admission::new(1, 16);
        let queued = ["a1", "a2", "a3", "b1", "b2"]
            .into_iter()
            .map(|tag| (tag, claim(&tag[..1], 0, 10), None))
            .collect();
        assert_eq!(
            served_order(&adm, queued).await,
            ["a1", "b1", "a2", "b2", "a3"]
        );
        // Priority still comes first: fairness only orders requests of the same urgency.
        let queued = vec![
            ("a5", claim("a", 5, 10), None),
            ("b5", claim("b", 5, 10), None),
            ("a0", claim("a", 0, 10), None),
            ("a0'", claim("a", 0, 10), None),
        ];
        assert_eq!(served_order(&adm, queued).await, ["a0", "a0'", "b5", "a5"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_real_token_count_replaces_the_estimate() {
        // a1 is charged 100 up front. Settled at 1 token, a is the less served tenant again after b1;
        // left at its estimate, b is served until it has caught up.
        let queued = |actual| {
            vec![
                ("a1", claim("a", 0, 100), Some(actual)),
                ("b1", claim("b", 0, 10), None),
                ("a2", claim("a", 0, 100), None),
                ("b2", claim("b", 0, 10), None),
                ("b3", claim("b", 0, 10), None),
            ]
        };
        let adm = Admission::new(1, 16);
        assert_eq!(
            served_order(&adm, queued(1)).await,
            ["a1", "b1", "a2", "b2", "b3"]
        );
        let adm = Admission::new(1, 16);
        assert_eq!(
            served_order(&adm, queued(100)).await,
            ["a1", "b1", "b2", "b3", "a2"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_tenant_waits_for_one_request_at_most_and_banks_no_idle_time() {
        let adm = Admission::new(1, 64);
        let log = Log::default();
        let hold = Duration::from_millis(100);
        let flood: Vec<_> = (0..20)
            .map(|_| request(&adm, &log, "a", claim("a", 0, 10), hold, None))
            .collect();
        tokio::time::sleep(Duration::from_millis(250)).await;
        // b has been idle while a was served: it goes next, but only once before a's next turn.
        let arrived = Instant::now();
        let b: Vec<_> = (0..3)
            .map(|_| request(&adm, &log, "b", claim("b", 0, 10), hold, None))
            .collect();
        for t in flood.into_iter().chain(b) {
            t.await.unwrap().unwrap();
        }
        let log = log.lock().unwrap().clone();
        let first_b = log.iter().find(|(t, _)| *t == "b").unwrap().1;
        assert!(first_b - arrived <= hold, "{:?}", first_b - arrived);
        let order: String = log.iter().map(|(t, _)| *t).collect();
        assert!(order.contains("abababa"), "{order}");
        assert!(!order.contains("bb"), "{order}");
    }

    #[tokio::test(start_paused = true)]
    async fn weights_divide_the_charge() {
        let adm = Admission::new(1, 64);
        let heavy = |tag| {
            let c = Claim {
                weight: 2.0,
                ..claim("h", 0, 10)
            };
            (tag, c, None)
        };
        let light = |tag| (tag, claim("l", 0, 10), None);
        let queued = vec![
            heavy("h1"),
            heavy("h2"),
            heavy("h3"),
            heavy("h4"),
            light("l1"),
            light("l2"),
        ];
        assert_eq!(
            served_order(&adm, queued).await,
            ["h1", "l1", "h2", "h3", "l2", "h4"]
        );
    }

    /// A priority-3 request of tenant `l` behind three clients of tenant `h` that keep sending
    /// priority-0 requests (each holding the slot 400 ms) for 10 s: returns how long it waited.
    async fn low_priority_wait(aging: Option<Duration>) -> Duration {
        let fairness = Fairness {
            aging,
            tenant_limit: None,
            ..Fairness::default()
        };
        let adm = Admission::with_fairness(1, 64, fairness);
        let log = Log::default();
        let hold = Duration::from_millis(400);
        let stop = Instant::now() + Duration::from_secs(10);
        let mut tasks: Vec<_> = (0..3)
            .map(|_| {
                let (adm, log) = (adm.clone(), log.clone());
                tokio::spawn(async move {
                    while Instant::now() < stop {
                        request(&adm, &log, "h", claim("h", 0, 10), hold, None)
                            .await
                            .unwrap()?;
                    }
                    Ok(())
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let arrived = Instant::now();
        tasks.push(request(&adm, &log, "low", claim("l", 3, 10), hold, None));
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let log = log.lock().unwrap().clone();
        log.iter().find(|(t, _)| *t == "low").unwrap().1 - arrived
    }

    #[tokio::test(start_paused = true)]
    async fn aging_lets_a_low_priority_request_through_a_stream_of_urgent_ones() {
        // The stream's requests wait under 1 s, so they stay at level 0; priority 3 reaches it after
        // 3 s, and its tenant is the less served one: it gets the next slot.
        let waited = low_priority_wait(Some(Duration::from_secs(1))).await;
        assert!(
            waited >= Duration::from_secs(3) && waited <= Duration::from_millis(3400),
            "{waited:?}"
        );
        let starved = low_priority_wait(None).await;
        assert!(starved >= Duration::from_secs(9), "{starved:?}");
    }

    fn with_share(capacity: usize, limit: usize) -> Admission {
        let fairness = Fairness {
            aging: None,
            tenant_limit: Some(limit),
            ..Fairness::default()
        };
        Admission::with_fairness(1, capacity, fairness)
    }

    #[tokio::test(start_paused = true)]
    async fn beside_others_a_tenant_may_hold_only_its_share_of_the_queue() {
        let adm = with_share(4, 2);
        let log = Log::default();
        let (held, _) = adm.acquire(claim("b", 0, 1), far()).await.unwrap();
        let hold = Duration::from_millis(10);
        let mut tasks = Vec::new();
        for _ in 0..2 {
            tasks.push(request(&adm, &log, "a", claim("a", 0, 1), hold, None));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // b is active (in service): a may not take a third place although the queue has room.
        let err = adm.acquire(claim("a", 0, 1), far()).await.err().unwrap();
        assert!(
            matches!(err, GateError::TenantQueueFull { waiting: 2, .. }),
            "{err:?}"
        );
        assert!(err.retry_after().unwrap() >= 1);
        tasks.push(request(&adm, &log, "c", claim("c", 0, 1), hold, None));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(adm.stats().depth, 3);
        let listed = adm.tenants(10);
        let a = listed.iter().find(|t| t.tenant == "a").unwrap();
        assert_eq!((a.waiting, a.in_service), (2, 0));
        drop(held);
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(tags(&log), ["a", "c", "a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn alone_a_tenant_may_fill_the_queue_until_another_needs_a_place() {
        let adm = with_share(4, 2);
        let log = Log::default();
        let (held, _) = adm.acquire(claim("a", 0, 1), far()).await.unwrap();
        let hold = Duration::from_millis(10);
        let mut tasks = Vec::new();
        for tag in ["a1", "a2", "a3", "a4"] {
            tasks.push(request(&adm, &log, tag, claim("a", 0, 1), hold, None));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(adm.stats().depth, 4);
        // b's arrival takes a's newest place; a is now held to its share.
        tasks.push(request(&adm, &log, "b", claim("b", 0, 1), hold, None));
        tokio::time::sleep(Duration::from_millis(1)).await;
        let over = tasks.swap_remove(3).await.unwrap().unwrap_err();
        assert!(
            matches!(over, GateError::TenantQueueFull { waiting: 4, .. }),
            "{over:?}"
        );
        let err = adm.acquire(claim("a", 0, 1), far()).await.err().unwrap();
        assert!(matches!(err, GateError::TenantQueueFull { .. }), "{err:?}");
        // A less urgent arrival does not take the place of a more urgent waiter.
        let err = adm.acquire(claim("c", 5, 1), far()).await.err().unwrap();
        assert!(matches!(err, GateError::QueueFull { .. }), "{err:?}");
        drop(held);
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(tags(&log), ["b", "a1", "a2", "a3"]);
    }

    #[tokio::test(start_paused = true)]
    async fn displacement_weighs_aged_priority() {
        let fairness = Fairness {
            aging: Some(Duration::from_secs(1)),
            tenant_limit: None,
            ..Fairness::default()
        };
        let adm = Admission::with_fairness(1, 2, fairness);
        let (_held, _) = adm.acquire(claim("x", 0, 1), far()).await.unwrap();
        let spawn = |prio| {
            let adm = adm.clone();
            tokio::spawn(async move { adm.acquire(claim("y", prio, 1), far()).await.map(|_| ()) })
        };
        let old = spawn(5);
        tokio::time::sleep(Duration::from_secs(3)).await; // old is at level 2 now
        let young = spawn(5);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let urgent = spawn(3);
        let displaced = young.await.unwrap().unwrap_err();
        assert!(
            matches!(displaced, GateError::Displaced { .. }),
            "{displaced:?}"
        );
        // Left: old (level 2) and urgent (level 3). Another 3 is not more urgent than either.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let err = adm.acquire(claim("y", 3, 1), far()).await.err().unwrap();
        assert!(matches!(err, GateError::QueueFull { .. }), "{err:?}");
        adm.close(1);
        for t in [old, urgent] {
            assert!(matches!(
                t.await.unwrap(),
                Err(GateError::ShuttingDown { .. })
            ));
        }
        assert_eq!(adm.tenants(10).iter().map(|t| t.waiting).sum::<usize>(), 0);
    }
}
