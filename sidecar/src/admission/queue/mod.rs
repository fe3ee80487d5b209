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
//!
//! This file is the queue's face: the [`Admission`] and its state, how a request enters it (a slot
//! at once, a place in the queue, or the refusal: [`Admission::enter`]), and how what is given back
//! goes to the waiters (`dispatch`). Each concern has a file of its own: `order` (who is served
//! next, who gives way), `pool` (what a request holds of the slots and the KV pool), `bands`,
//! `cap`, `drain` (the Retry-After model), `returns`, `shed`, `model` (one router model's pool),
//! `stats`, `view`, `slot` (the [`SlotGuard`]) and `ticket`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::bands::Bands;
use super::cap::InService;
use super::claim::Claim;
use super::fair::Tenants;
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
    /// What a prompt token llama-server read from its cache counts for in the tenants' shares
    /// (`--cached-token-weight`): all of a new one by default.
    pub cached_weight: CachedWeight,
}

/// The share of a new token a cached prompt token counts for, in millionths (so [`Fairness`] stays
/// `Eq`): 1 by default, every token in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedWeight(u32);

impl Default for CachedWeight {
    fn default() -> Self {
        CachedWeight(1_000_000)
    }
}

impl CachedWeight {
    /// `w`, a share from 0 to 1 (the configuration has checked it).
    pub fn new(w: f64) -> Self {
        CachedWeight((w.clamp(0.0, 1.0) * 1e6).round() as u32)
    }

    pub fn get(self) -> f64 {
        f64::from(self.0) / 1e6
    }

    /// The tokens `usage` counts for: its new prompt tokens and output in full, its cached ones
    /// at this weight (rounded to the nearest token).
    pub fn count(self, usage: &crate::dialect::usage::Usage) -> u64 {
        let cached = usage.cached_tokens.min(usage.prompt_tokens);
        let weighted = (cached as u128 * u128::from(self.0) + 500_000) / 1_000_000;
        usage
            .uncached_tokens()
            .saturating_add(usage.completion_tokens)
            .saturating_add(weighted as u64)
    }
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
    /// CPUs (see `router::turns`).
    turn: std::sync::OnceLock<Box<dyn Turn>>,
    /// Its overload bands (see `admission::bands`); none until set.
    bands: std::sync::OnceLock<Bands>,
    /// Requests shed since start: sent back to the queue before their first byte, and ended after.
    shed_requeued: AtomicU64,
    shed_ended: AtomicU64,
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

impl Admission {
    pub fn new(slots: usize, capacity: usize) -> Self {
        Self::with_fairness(slots, capacity, Fairness::default())
    }

    pub fn with_fairness(slots: usize, capacity: usize, fairness: Fairness) -> Self {
        Self::build(slots, capacity, fairness, None)
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
        if let Some(slot) = self.start_at_once(&mut st, &claim, arrived) {
            return Ok(Entry::Admitted(slot));
        }
        // Its tenant over its caps: refused before any estimate (its wait is its tenant's own).
        self.check_cap(&st, &claim)?;
        self.check_doomed(&mut st, &claim, deadline)?;
        self.check_share(&mut st, &claim)?;
        self.check_band_queue(&mut st, &claim)?;
        self.make_room(&mut st, &claim, returning, arrived)?;
        Ok(Entry::Queued(self.enqueue(&mut st, claim)))
    }

    /// A slot at once when `claim` fits and nobody who could start would be served before it
    /// (waiters held back by their band's share of the slots do not count: they could not take the
    /// slot).
    fn start_at_once(&self, st: &mut State, claim: &Claim, arrived: Instant) -> Option<SlotGuard> {
        if self.anyone_before(st, claim, arrived) || !self.try_start(st, claim) {
            return None;
        }
        let hold = self.hold_of(claim);
        self.take(st, hold, claim);
        st.tenants.admit(&claim.tenant, claim.charge());
        let seq = st.next_seq;
        st.next_seq += 1;
        let enlisted = self.enlist(st, claim, hold, seq, Instant::now());
        self.publish(st);
        Some(self.guard(claim, hold, enlisted))
    }

    /// Gives `claim`, found a place, its place in the queue.
    fn enqueue(&self, st: &mut State, claim: Claim) -> Ticket {
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
        self.dispatch(st);
        Ticket::new(self.clone(), seq, claim, rx)
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

    /// Whether the queue was closed (shutting down).
    pub fn is_closed(&self) -> bool {
        self.lock().closed
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
            team: claim.team_cap.as_ref().map(|(t, _)| t.clone()),
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

/// What [`Admission::enter`] gives: a slot now, or a place in the queue.
pub enum Entry {
    Admitted(SlotGuard),
    Queued(Ticket),
}

mod bands;
mod cap;
mod drain;
mod model;
mod order;
mod pool;
mod returns;
mod shed;
mod slot;
mod stats;
mod ticket;
mod view;

use drain::Drain;
use model::ModelGauges;
use pool::Hold;
#[cfg(test)]
mod tests;

pub use model::{Turn, WeakAdmission};
pub use shed::{Shed, MAX_REQUEUES, SHED_GUARD};
pub use slot::SlotGuard;
pub use stats::{BandStats, QueueStats, TenantStats};
pub use ticket::Ticket;
pub use view::WaiterView;
