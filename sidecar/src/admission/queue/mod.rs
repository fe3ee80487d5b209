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
//! A waiter whose tenant has as many requests in service as its cap allows is passed over without
//! holding back those behind it (see [`cap`]), like one whose band holds its share of the slots.
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

use super::bands::Bands;
use super::cap::InService;
use super::claim::Claim;
use super::fair::Tenants;
use super::turns::{Seat, Turns};
use crate::error::GateError;
use crate::metrics::{self as m, BoundedLabels};

/// Weight of the newest sample in the service-time average.
const EWMA_ALPHA: f64 = 0.2;
/// Assumed service time until the first request has been measured.
const INITIAL_SERVICE_SECONDS: f64 = 1.0;
/// Distinct tenants with their own `slotgate_tenant_tokens_total` series; the rest share `other`.
const TENANT_LABELS: usize = 50;

#[derive(Clone)]
pub struct Admission {
    shared: Arc<Shared>,
}

/// An [`Admission`] that does not keep its pool alive (what the turns hold of each pool).
pub(crate) struct WeakAdmission(std::sync::Weak<Shared>);

impl WeakAdmission {
    pub(crate) fn upgrade(&self) -> Option<Admission> {
        self.0.upgrade().map(|shared| Admission { shared })
    }
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
    /// Requests of this priority or less urgent (greater) are sheddable: one holding a slot an
    /// urgent arrival needs is ended for it (see `admission::shed`); `None`: nothing is shed.
    pub shed_from: Option<i64>,
    /// A request whose tenant is at its concurrency cap is refused at arrival (429
    /// `tenant_busy`) rather than queued until one of its tenant's requests ends (see [`cap`]).
    pub refuse_at_cap: bool,
}

struct Shared {
    /// Changes only through [`Admission::set_slots`] (`--slots auto` following llama-server).
    slots: AtomicUsize,
    /// Tokens of the KV pool the slots share; 0: each slot has a context of its own (not limited
    /// here). Changes through [`Admission::set_pool`].
    pool: AtomicU64,
    capacity: usize,
    fairness: Fairness,
    /// The model this pool serves, in front of llama-server's router: its own gauges.
    model: Option<ModelGauges>,
    /// Its place in the turns the router's models take while their threads oversubscribe the
    /// CPUs (see `admission::turns`).
    turn: std::sync::OnceLock<Seat>,
    /// Its overload bands (see `admission::bands`); none until set.
    bands: std::sync::OnceLock<Bands>,
    /// Requests shed since start: sent back to the queue before their first byte, and ended after.
    shed_requeued: AtomicU64,
    shed_ended: AtomicU64,
    state: Mutex<State>,
}

/// The `model`-labelled gauges of one model's pool.
struct ModelGauges {
    depth: metrics::Gauge,
    busy: metrics::Gauge,
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
    /// When each tenant's requests in service started (see [`cap`]).
    in_service: InService,
    labels: BoundedLabels,
    next_seq: u64,
    closed: bool,
    /// The Retry-After the waiters were told when the queue closed.
    closed_retry_after: u64,
    service_ewma: Option<f64>,
    /// The token model of the drain: see [`Drain`].
    drain: Drain,
    /// Nobody is admitted, whatever is free: the model is not loaded (see [`Admission::pause`]).
    paused: bool,
    /// When the paused pool is expected to serve again (its model loaded): counted in every wait
    /// estimate.
    ready_at: Option<Instant>,
    /// What [`Admission::publish`] last added to the unlabelled gauges, which sum every pool: queue
    /// depth, busy slots, pool tokens reserved, tenants at their cap.
    shown: (f64, f64, f64, f64),
    /// Slots held by each band's requests in service (by band index; grown on use).
    band_busy: Vec<usize>,
    /// Sheddable requests in service, by guard id (see [`shed`]).
    sheddable: BTreeMap<u64, shed::Running>,
    /// What requests told to yield hold until their guards drop (and the tokens they were charged),
    /// by guard id.
    freeing: BTreeMap<u64, (Hold, u64)>,
    next_shed_id: u64,
    /// When a look at the waiters is due for a shed the guard time holds back (see [`shed`]).
    shed_wake: Option<Instant>,
    /// Clients told to come back, each with a queue place held for it around its time (see
    /// [`returns`]).
    bookings: Vec<returns::Booking>,
}

struct Waiter {
    claim: Claim,
    queued: Instant,
    tx: oneshot::Sender<Grant>,
}

/// What a waiter is told when it leaves the queue other than by timing out.
enum Grant {
    /// Its slots (and pool tokens) are taken for it: this many; and, sheddable, its guard id and
    /// how it hears it must yield.
    Slot(Hold, Option<Enlisted>),
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
    /// Its model could not be loaded.
    Unavailable {
        model: Arc<str>,
        reason: Arc<str>,
        retry_after: Duration,
    },
}

/// A sheddable request's registration (see [`Admission::enlist`]).
type Enlisted = (u64, Box<shed::Yielding>);

/// What one request in service holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hold {
    slots: usize,
    kv: u64,
    /// The band it counts against.
    band: Option<usize>,
    /// When it was taken: its tenant's cap counts it from then (see [`cap`]).
    since: Instant,
}

/// One overload band of a pool now, for `/status`.
#[derive(Debug, Clone, PartialEq)]
pub struct BandStats {
    pub name: Arc<str>,
    pub priorities: (i64, i64),
    pub slots_busy: usize,
    pub slot_limit: Option<usize>,
    pub waiting: usize,
    pub queue_limit: Option<usize>,
    /// Refused since start, its share of the queue full (over every pool).
    pub refused: u64,
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
    /// Waiters with a deadline of their own (see `Claim::deadline`).
    pub with_deadline: usize,
    /// Sheddable requests in service (see [`shed`]), and those told to yield still giving back.
    pub sheddable: usize,
    pub yielding: usize,
    /// Requests shed since start: queued again before their first byte, ended after it.
    pub shed_requeued: u64,
    pub shed_ended: u64,
}

impl QueueStats {
    /// Seconds until the work already admitted (in service and waiting) has drained.
    pub fn drain_seconds(&self) -> f64 {
        self.wait_seconds
    }
}

impl TenantStats {
    /// Orders tenants the next to be served first (lowest counter, then name), keeping `limit`.
    pub fn next_served_first(all: &mut Vec<TenantStats>, limit: usize) {
        all.sort_by(|a, b| {
            a.counter
                .total_cmp(&b.counter)
                .then_with(|| a.tenant.cmp(&b.tenant))
        });
        all.truncate(limit);
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
        Self::build(slots, capacity, fairness, None)
    }

    /// The pool of one model behind llama-server's router: it starts paused (the model is loaded
    /// first), and has `model`-labelled gauges besides its part of the unlabelled ones.
    pub fn for_model(slots: usize, capacity: usize, fairness: Fairness, model: &str) -> Self {
        let gauges = ModelGauges {
            depth: metrics::gauge!(m::MODEL_QUEUE_DEPTH, "model" => model.to_owned()),
            busy: metrics::gauge!(m::MODEL_SLOTS_BUSY, "model" => model.to_owned()),
        };
        metrics::gauge!(m::MODEL_QUEUE_CAPACITY, "model" => model.to_owned()).set(capacity as f64);
        let a = Self::build(slots, capacity, fairness, Some(gauges));
        a.lock().paused = true;
        a
    }

    fn build(
        slots: usize,
        capacity: usize,
        fairness: Fairness,
        model: Option<ModelGauges>,
    ) -> Self {
        Admission {
            shared: Arc::new(Shared {
                slots: AtomicUsize::new(slots),
                pool: AtomicU64::new(0),
                capacity,
                fairness,
                model,
                turn: std::sync::OnceLock::new(),
                bands: std::sync::OnceLock::new(),
                shed_requeued: AtomicU64::new(0),
                shed_ended: AtomicU64::new(0),
                state: Mutex::new(State {
                    busy: 0,
                    serving: 0,
                    kv: 0,
                    waiters: BTreeMap::new(),
                    tenants: Tenants::default(),
                    in_service: InService::default(),
                    labels: BoundedLabels::new(TENANT_LABELS, m::TENANT_TOKENS_TOTAL, "tenant"),
                    next_seq: 0,
                    closed: false,
                    closed_retry_after: 1,
                    service_ewma: None,
                    drain: Drain::default(),
                    paused: false,
                    ready_at: None,
                    shown: (0.0, 0.0, 0.0, 0.0),
                    band_busy: Vec::new(),
                    sheddable: BTreeMap::new(),
                    freeing: BTreeMap::new(),
                    next_shed_id: 0,
                    shed_wake: None,
                    bookings: Vec::new(),
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
    pub fn enter(&self, mut claim: Claim, deadline: Instant) -> Result<Entry, GateError> {
        claim.band = self.bands().of(claim.priority);
        let mut st = self.lock();
        if st.closed {
            return Err(GateError::ShuttingDown { retry_after: 1 });
        }
        let arrived = Instant::now();
        // Its own deadline went by while it was read and judged: it is not started now.
        if claim
            .deadline
            .is_some_and(|own| own <= arrived && own <= deadline)
        {
            return Err(GateError::DeadlineExceeded(Duration::ZERO));
        }
        // A client back when it was told takes the place kept for it.
        let returning = self.take_booking(&mut st, &claim, arrived);
        // At once when it fits and nobody who could start would be served before it (waiters held
        // back by their band's share of the slots do not count: they could not take the slot).
        if !self.anyone_before(&st, &claim, arrived) && self.try_start(&st, &claim) {
            let hold = self.hold_of(&claim);
            self.take(&mut st, hold, &claim);
            st.tenants.admit(&claim.tenant, claim.charge());
            let seq = st.next_seq;
            st.next_seq += 1;
            let enlisted = self.enlist(&mut st, &claim, hold, seq, Instant::now());
            self.publish(&mut st);
            return Ok(Entry::Admitted(self.guard(&claim, hold, enlisted)));
        }
        // Its tenant over its caps: refused before any estimate (its wait is its tenant's own).
        self.check_cap(&st, &claim)?;
        // A request's own deadline is always held to: it said how long its answer is worth.
        let own = claim.deadline.filter(|d| *d <= deadline);
        if self.shared.fairness.reject_doomed || own.is_some() {
            let now = Instant::now();
            let by = own.unwrap_or(deadline);
            let left = by.saturating_duration_since(now).as_secs_f64();
            if let Some(estimate) = self.wait_before(&st, &claim, now) {
                if estimate > left {
                    let retry_after = self.retry_after(&mut st, claim.cost);
                    return Err(match own {
                        Some(_) => GateError::DeadlineUnreachable {
                            estimate: Duration::try_from_secs_f64(estimate)
                                .unwrap_or(Duration::MAX),
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
        }
        if let Some(limit) = self.shared.fairness.tenant_limit {
            // Alone, a tenant may use the whole queue; beside others, only its share.
            let waiting = st.tenants.waiting(&claim.tenant);
            if waiting >= limit && st.tenants.others_active(&claim.tenant) {
                let retry_after = self.retry_after(&mut st, claim.cost);
                self.book_return(&mut st, &claim, retry_after);
                return Err(GateError::TenantQueueFull {
                    waiting,
                    retry_after,
                });
            }
        }
        if let Some(b) = claim.band {
            // A band holding its share of the places: the rest are for the other bands.
            if let Some(limit) = self.bands().queue_limit(b, self.shared.capacity) {
                let waiting = st
                    .waiters
                    .values()
                    .filter(|w| w.claim.band == Some(b))
                    .count();
                if waiting >= limit {
                    self.bands().refused(b);
                    return Err(GateError::BandQueueFull {
                        band: self.bands().get(b).name.to_string(),
                        waiting,
                        retry_after: self.retry_after(&mut st, claim.cost),
                    });
                }
            }
        }
        // The places kept for clients due back count as taken, except for those clients.
        let held = match returning {
            true => 0,
            false => Self::held_places(&st, arrived),
        };
        if st.waiters.len() + held >= self.shared.capacity {
            let now = Instant::now();
            if let Some(seq) = self.over_share_victim(&st, &claim, now) {
                // A tenant beyond its share gives up its newest place to one within its share.
                if let Some(w) = st.waiters.remove(&seq) {
                    let waiting = st.tenants.waiting(&w.claim.tenant);
                    st.tenants.dequeue(&w.claim.tenant);
                    let retry_after = self.retry_after(&mut st, w.claim.cost);
                    self.book_return(&mut st, &w.claim, retry_after);
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
                            self.book_return(&mut st, &w.claim, retry_after);
                            let _ = w.tx.send(Grant::Displaced { retry_after });
                        }
                    }
                    _ => {
                        let retry_after = self.retry_after(&mut st, claim.cost);
                        self.book_return(&mut st, &claim, retry_after);
                        return Err(GateError::QueueFull {
                            depth: st.waiters.len(),
                            retry_after,
                        });
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
        // Urgent, it may have sheddable work yield to it (dispatch sheds and publishes).
        self.dispatch(&mut st);
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
        self.aged(w.claim.priority, now.saturating_duration_since(w.queued))
    }

    /// `priority` after waiting `waited`.
    fn aged(&self, priority: i64, waited: Duration) -> i64 {
        let Some(step) = self.shared.fairness.aging else {
            return priority;
        };
        let levels = waited.as_nanos() / step.as_nanos();
        priority.saturating_sub(i64::try_from(levels).unwrap_or(i64::MAX))
    }

    /// The waiter served next: the smallest [`Place`].
    fn next_waiter(&self, st: &State, now: Instant) -> Option<u64> {
        let least = Self::least_counter(st, |t| st.tenants.counter(t));
        st.waiters
            .iter()
            // A waiter whose band holds its share of the slots, or whose tenant is at its cap, waits
            // without blocking the others.
            .filter(|(_, w)| !self.held_back(st, &w.claim))
            .map(|(seq, w)| {
                let counter = st.tenants.counter(&w.claim.tenant);
                self.place(&w.claim, self.effective(w, now), counter, least, *seq)
            })
            .min_by(Place::cmp)
            .map(|p| p.seq)
    }

    /// Whether a waiter that could start (its band within its share of the slots, its tenant below
    /// its cap) would be served before `claim`, were it queued now.
    fn anyone_before(&self, st: &State, claim: &Claim, now: Instant) -> bool {
        if st.waiters.is_empty() {
            return false;
        }
        let ahead = self.ahead_of(st, claim, now);
        st.waiters
            .values()
            .any(|w| !self.held_back(st, &w.claim) && ahead(w))
    }

    /// Whether `claim` could not start now whatever is free: its band holds its share of the
    /// slots, or its tenant is at its cap.
    fn held_back(&self, st: &State, claim: &Claim) -> bool {
        self.band_full(st, claim) || self.at_cap(st, claim)
    }

    /// Whether a waiter would be served before `claim`, were `claim` queued now.
    fn ahead_of<'a>(
        &'a self,
        st: &'a State,
        claim: &Claim,
        now: Instant,
    ) -> impl Fn(&Waiter) -> bool + 'a {
        let counter = |w: &Waiter| st.tenants.counter(&w.claim.tenant);
        let mine = st.tenants.counter(&claim.tenant);
        let any_due =
            claim.deadline.is_some() || st.waiters.values().any(|w| w.claim.deadline.is_some());
        let least = match any_due {
            true => st.waiters.values().map(counter).fold(mine, f64::min),
            false => f64::MAX,
        };
        let me = self.place(claim, claim.priority, mine, least, st.next_seq);
        // Every waiter came before it (a smaller sequence).
        move |w: &Waiter| {
            let p = self.place(&w.claim, self.effective(w, now), counter(w), least, 0);
            p.cmp(&me).is_lt()
        }
    }

    /// Where a claim stands in the service order, its tenant's counter at `counter` and the least
    /// counter of any waiting tenant `least` (only looked at when some waiter has a deadline).
    fn place(&self, claim: &Claim, effective: i64, counter: f64, least: f64, seq: u64) -> Place {
        // A deadline counts while its tenant is no more than this request ahead of the least
        // served: a tenant sending only short deadlines cannot take more than its share.
        let due = claim.deadline.filter(|_| counter <= least + claim.charge());
        Place {
            priority: effective,
            due,
            counter,
            seq,
        }
    }

    /// The least counter of the tenants waiting with a deadline beside others (`f64::MAX`: no
    /// waiter has a deadline, so none is compared).
    fn least_counter(st: &State, counter: impl Fn(&str) -> f64) -> f64 {
        if !st.waiters.values().any(|w| w.claim.deadline.is_some()) {
            return f64::MAX;
        }
        st.waiters
            .values()
            .map(|w| counter(&w.claim.tenant))
            .fold(f64::MAX, f64::min)
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
            band: claim.band,
            since: Instant::now(),
        }
    }

    /// Whether `claim` can be admitted beside what is in service; when it can, its start is
    /// counted in the models' turns (the caller admits it).
    fn try_start(&self, st: &State, claim: &Claim) -> bool {
        if !self.fits_beside(st, claim, shed::Freed::default()) {
            return false;
        }
        match self.shared.turn.get() {
            Some(seat) => seat.start(st.serving, self.slots(), Self::oldest(st)),
            None => true,
        }
    }

    /// Whether `claim` could be admitted beside what is in service once `freed` has been given
    /// back (see [`shed`]).
    fn fits_beside(&self, st: &State, claim: &Claim, freed: shed::Freed) -> bool {
        if st.paused || self.held_back(st, claim) {
            return false;
        }
        let serving = st.serving.saturating_sub(freed.serving);
        if let Some(seat) = self.shared.turn.get() {
            if !seat.allows(serving, self.slots(), Self::oldest(st)) {
                return false;
            }
        }
        if serving == 0 {
            return true;
        }
        let hold = self.hold_of(claim);
        let (busy, kv) = (
            st.busy.saturating_sub(freed.slots),
            st.kv.saturating_sub(freed.kv),
        );
        busy + hold.slots <= self.slots() && self.pool().is_none_or(|p| kv + hold.kv <= p)
    }

    /// Whether `claim`'s band already holds its share of the slots, with some of it in service (a
    /// band with nothing in service may start a request however many slots it takes).
    fn band_full(&self, st: &State, claim: &Claim) -> bool {
        let Some(b) = claim.band else {
            return false;
        };
        let Some(limit) = self.bands().slot_limit(b, self.slots()) else {
            return false;
        };
        let busy = st.band_busy.get(b).copied().unwrap_or(0);
        busy > 0 && busy + self.hold_of(claim).slots > limit
    }

    /// The pool's overload bands (none until [`Admission::set_bands`]).
    fn bands(&self) -> &Bands {
        static NONE: std::sync::OnceLock<Bands> = std::sync::OnceLock::new();
        self.shared
            .bands
            .get()
            .unwrap_or_else(|| NONE.get_or_init(Bands::default))
    }

    /// Limits each band's share of the slots and queue places from now on (once).
    pub fn set_bands(&self, bands: Bands) {
        let _ = self.shared.bands.set(bands);
    }

    /// The band a request at `priority` belongs to, by name.
    pub fn band_of(&self, priority: i64) -> Option<Arc<str>> {
        let bands = self.bands();
        bands.of(priority).map(|b| bands.get(b).name.clone())
    }

    /// Each band now: what it holds and may hold.
    pub fn band_stats(&self) -> Vec<BandStats> {
        let bands = self.bands();
        let st = self.lock();
        (0..bands.len())
            .map(|b| {
                let band = bands.get(b);
                BandStats {
                    name: band.name.clone(),
                    priorities: band.priorities,
                    slots_busy: st.band_busy.get(b).copied().unwrap_or(0),
                    slot_limit: bands.slot_limit(b, self.slots()),
                    waiting: st
                        .waiters
                        .values()
                        .filter(|w| w.claim.band == Some(b))
                        .count(),
                    queue_limit: bands.queue_limit(b, self.shared.capacity),
                    refused: bands.refused_total(b),
                }
            })
            .collect()
    }

    /// Counts `hold` (of `claim`) as in service.
    fn take(&self, st: &mut State, hold: Hold, claim: &Claim) {
        if let Some(b) = hold.band {
            if st.band_busy.len() <= b {
                st.band_busy.resize(b + 1, 0);
            }
            st.band_busy[b] += hold.slots;
        }
        st.busy += hold.slots;
        st.kv += hold.kv;
        st.serving += 1;
        st.drain.in_service += claim.cost as f64;
        st.in_service
            .start(&claim.tenant, claim.cap.in_service, hold.since);
    }

    /// Turns every waiter away and refuses new ones; slots already held drain normally.
    pub fn close(&self, retry_after: u64) {
        let mut st = self.lock();
        st.closed = true;
        st.closed_retry_after = retry_after;
        for (_, w) in std::mem::take(&mut st.waiters) {
            st.tenants.dequeue(&w.claim.tenant);
            let _ = w.tx.send(Grant::ShuttingDown { retry_after });
        }
        self.publish(&mut st);
    }

    /// Admits nobody from now on, whatever is free (its model is not loaded); arrivals queue.
    /// Requests in service finish.
    pub fn pause(&self) {
        let mut st = self.lock();
        st.paused = true;
        self.publish(&mut st);
    }

    /// Takes turns with the other pools of `turns` (see `admission::turns`).
    pub fn join_turns(&self, turns: &Turns) {
        let _ = self.shared.turn.set(turns.seat(self));
    }

    pub(crate) fn downgrade(&self) -> WeakAdmission {
        WeakAdmission(Arc::downgrade(&self.shared))
    }

    /// Looks at the waiters again (another pool's turn ended).
    pub(crate) fn dispatch_now(&self) {
        let mut st = self.lock();
        self.dispatch(&mut st);
    }

    /// When its oldest waiter queued (the first by arrival).
    fn oldest(st: &State) -> Option<Instant> {
        st.waiters.first_key_value().map(|(_, w)| w.queued)
    }

    /// Pauses the pool only if nothing is in service or waiting: then its model may be unloaded
    /// without any request losing it. Returns whether it did.
    pub fn pause_if_idle(&self) -> bool {
        let mut st = self.lock();
        if st.serving > 0 || !st.waiters.is_empty() {
            return false;
        }
        st.paused = true;
        self.publish(&mut st);
        true
    }

    /// Admits again (its model is loaded), at once to the waiters.
    pub fn resume(&self) {
        let mut st = self.lock();
        st.paused = false;
        st.ready_at = None;
        self.dispatch(&mut st);
    }

    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    /// When a paused pool is expected to serve again: what every wait estimate adds (`None`: not
    /// known).
    pub fn set_ready_in(&self, after: Option<Duration>) {
        self.lock().ready_at = after.map(|d| Instant::now() + d);
    }

    /// Turns every waiter away with a 503 naming `model` (it failed to load); new arrivals still
    /// queue.
    pub fn fail_waiters(&self, model: &str, reason: &str, retry_after: Duration) {
        let mut st = self.lock();
        let (model, reason): (Arc<str>, Arc<str>) = (model.into(), reason.into());
        for (_, w) in std::mem::take(&mut st.waiters) {
            st.tenants.dequeue(&w.claim.tenant);
            let _ = w.tx.send(Grant::Unavailable {
                model: model.clone(),
                reason: reason.clone(),
                retry_after,
            });
        }
        self.publish(&mut st);
    }

    /// Whether nothing is in service or waiting.
    pub fn is_idle(&self) -> bool {
        let st = self.lock();
        st.serving == 0 && st.waiters.is_empty()
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
            with_deadline: st
                .waiters
                .values()
                .filter(|w| w.claim.deadline.is_some())
                .count(),
            sheddable: st.sheddable.len(),
            yielding: st.freeing.len(),
            shed_requeued: self.shared.shed_requeued.load(Ordering::Relaxed),
            shed_ended: self.shared.shed_ended.load(Ordering::Relaxed),
        }
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
        TenantStats::next_served_first(&mut all, limit);
        all
    }

    /// The guard of what `hold` took, already counted as in service and charged to `claim`'s tenant.
    fn guard(&self, claim: &Claim, hold: Hold, enlisted: Option<Enlisted>) -> SlotGuard {
        let (shed_id, yielding) = match enlisted {
            Some((id, y)) => (Some(id), Some(y)),
            None => (None, None),
        };
        SlotGuard {
            shed_id,
            yielding,
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
                .is_some_and(|w| self.try_start(st, &w.claim))
            {
                break;
            }
            let Some(w) = st.waiters.remove(&seq) else {
                break;
            };
            let hold = self.hold_of(&w.claim);
            let enlisted = self.enlist(st, &w.claim, hold, seq, w.queued);
            let id = enlisted.as_ref().map(|(id, _)| *id);
            if w.tx.send(Grant::Slot(hold, enlisted)).is_ok() {
                self.take(st, hold, &w.claim);
                st.tenants.promote(&w.claim.tenant, w.claim.charge());
            } else {
                if let Some(id) = id {
                    self.discharge(st, id);
                }
                st.tenants.dequeue(&w.claim.tenant);
            }
        }
        self.shed_for_next(st);
        self.publish(st);
    }

    /// The gauges: the unlabelled ones sum every pool (each adds what changed since it last
    /// published), a model's pool sets its own.
    fn publish(&self, st: &mut State) {
        let hot = m::hot();
        let now = (
            st.waiters.len() as f64,
            st.busy as f64,
            st.kv as f64,
            st.in_service.at_cap() as f64,
        );
        let (d, b, k, c) = st.shown;
        if now.0 != d {
            hot.queue_depth.increment(now.0 - d);
        }
        if now.1 != b {
            hot.slots_busy.increment(now.1 - b);
        }
        if now.2 != k {
            hot.kv_reserved.increment(now.2 - k);
        }
        if now.3 != c {
            hot.tenants_at_cap.increment(now.3 - c);
        }
        st.shown = now;
        if let Some(g) = &self.shared.model {
            g.depth.set(now.0);
            g.busy.set(now.1);
        }
        if let Some(seat) = self.shared.turn.get() {
            let oldest = if st.paused { None } else { Self::oldest(st) };
            let now = Instant::now();
            let busy = st.serving > 0 || (!st.paused && !st.waiters.is_empty());
            let done_at = busy.then(|| {
                now + Duration::try_from_secs_f64(self.own_wait_seconds(st, now))
                    .unwrap_or(Duration::ZERO)
            });
            seat.update(st.serving, oldest, done_at);
        }
    }
}

/// Where a waiter stands in the service order, smallest first:
///
/// 1. its effective priority (after aging);
/// 2. then, within a priority level, the waiters with a deadline (see [`Claim::deadline`]) by the
///    earliest, while their tenant is within its fair share (no more than that request ahead of
///    the least-served waiting tenant); the others after them;
/// 3. then its tenant's virtual counter (the least served first);
/// 4. then arrival.
#[derive(Debug, Clone, Copy)]
struct Place {
    priority: i64,
    due: Option<Instant>,
    counter: f64,
    seq: u64,
}

impl Place {
    fn cmp(&self, other: &Place) -> std::cmp::Ordering {
        // A deadline comes before none (`None` sorts first in `Option`'s order, so compare by hand).
        let due = match (self.due, other.due) {
            (Some(a), Some(b)) => a.cmp(&b),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        };
        self.priority
            .cmp(&other.priority)
            .then(due)
            .then(self.counter.total_cmp(&other.counter))
            .then(self.seq.cmp(&other.seq))
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
                None => return Err(self.timed_out(deadline)),
            },
        };
        self.resolved = true;
        match grant {
            // Granted in the same instant as the deadline passed: the promise was "never forwarded
            // after the timeout", so the slot goes straight on to the next waiter.
            Grant::Slot(hold, enlisted) if Instant::now() > deadline => {
                self.guard(hold, enlisted).settle(0);
                Err(self.timed_out(deadline))
            }
            Grant::Slot(hold, enlisted) => Ok((self.guard(hold, enlisted), self.queued.elapsed())),
            Grant::Displaced { retry_after } => Err(GateError::Displaced { retry_after }),
            Grant::OverShare {
                waiting,
                retry_after,
            } => Err(GateError::TenantQueueFull {
                waiting,
                retry_after,
            }),
            Grant::ShuttingDown { retry_after } => Err(GateError::ShuttingDown { retry_after }),
            Grant::Unavailable {
                model,
                reason,
                retry_after,
            } => Err(GateError::ModelUnavailable {
                model: model.to_string(),
                reason: reason.to_string(),
                retry_after,
            }),
        }
    }

    /// Its wait reached `deadline`: its own (504 `deadline_exceeded`) or the queue timeout.
    fn timed_out(&self, deadline: Instant) -> GateError {
        let waited = self.queued.elapsed();
        match self.claim.deadline.is_some_and(|own| own <= deadline) {
            true => GateError::DeadlineExceeded(waited),
            false => GateError::QueueTimeout(waited),
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
            // It may have been the waiter that held those behind it back (it did not fit yet).
            self.admission.dispatch(&mut st);
            return None;
        }
        drop(st);
        self.rx.try_recv().ok()
    }

    /// What this ticket was granted (already in service and charged when the grant was sent).
    fn guard(&self, hold: Hold, enlisted: Option<Enlisted>) -> SlotGuard {
        self.admission.guard(&self.claim, hold, enlisted)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.resolved {
            return;
        }
        if let Some(Grant::Slot(hold, enlisted)) = self.leave() {
            // Never used: nothing was served, and the slot goes on to the next waiter.
            self.guard(hold, enlisted).settle(0);
        }
    }
}

mod cap;
mod drain;
mod returns;
mod shed;
mod slot;
mod view;

use drain::Drain;
#[cfg(test)]
mod tests;

pub use shed::{Shed, MAX_REQUEUES, SHED_GUARD};
pub use slot::SlotGuard;
pub use view::WaiterView;
