//! Models taking turns on the CPUs. In front of llama-server's router, each model is a child
//! llama-server with its own threads; when the loaded children's threads together exceed the
//! machine's CPUs, two models decoding at once run several times slower than one after the other
//! (docs/router.md). While that is so, the pools of the models take turns:
//!
//! - a pool starts a request only while no other model has one in service;
//! - between turns (no model in service), the model with the oldest waiter goes first;
//! - in its turn a model starts a batch of as many requests as it has slots, and more only while
//!   no other model waits; then its turn ends when what it has in service is done. So every model
//!   decodes on all its slots, and a waiter waits at most one batch of each other model.
//!
//! Each pool keeps a [`Seat`]: what it has in service and its oldest waiter, published under its
//! own lock each time they change. A seat whose change may let another pool start wakes the kicker,
//! a task that dispatches every pool one at a time (never two pools' locks at once).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::queue::{Admission, WeakAdmission};

/// The turns every model's pool takes while their threads oversubscribe the CPUs.
#[derive(Clone, Default)]
pub struct Turns {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Turns are taken (the loaded models' threads exceed the CPUs).
    on: AtomicBool,
    seats: Mutex<Vec<SeatState>>,
    kick: tokio::sync::Notify,
    /// The kicker task runs.
    kicking: AtomicBool,
}

struct SeatState {
    serving: usize,
    /// Requests started in its current turn.
    started: usize,
    /// Its oldest waiter that could start now but for the turns (none while its pool is paused).
    oldest: Option<Instant>,
    /// When its work in service and waiting is expected to be done (its own estimate; none while
    /// its pool is paused, holding nobody back).
    done_at: Option<Instant>,
    /// Its pool, to dispatch when another's turn ends (weak: the pool holds its seat).
    pool: Option<WeakAdmission>,
}

/// One pool's place in the turns.
pub struct Seat {
    turns: Turns,
    id: usize,
}

impl Turns {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether pools take turns now.
    pub fn is_on(&self) -> bool {
        self.inner.on.load(Ordering::Acquire)
    }

    /// Turns on (the loaded models' threads exceed the CPUs) or off. Off, every pool may start
    /// again at once.
    pub fn set(&self, on: bool) {
        if self.inner.on.swap(on, Ordering::AcqRel) != on {
            self.inner.kick.notify_one();
        }
    }

    /// A seat for `admission`'s pool. The kicker starts with the first seat (it needs a runtime).
    pub(super) fn seat(&self, admission: &Admission) -> Seat {
        let mut seats = self.lock();
        seats.push(SeatState {
            serving: 0,
            started: 0,
            oldest: None,
            done_at: None,
            pool: Some(admission.downgrade()),
        });
        let id = seats.len() - 1;
        drop(seats);
        self.start_kicker();
        Seat {
            turns: self.clone(),
            id,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SeatState>> {
        self.inner.seats.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn start_kicker(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.inner.kicking.swap(true, Ordering::AcqRel) {
            return;
        }
        // One per process, as long as it runs (the turns live as long as the models do).
        let inner = self.inner.clone();
        rt.spawn(async move {
            loop {
                inner.kick.notified().await;
                let pools: Vec<Admission> = {
                    let seats = inner.seats.lock().unwrap_or_else(|p| p.into_inner());
                    seats
                        .iter()
                        .filter_map(|s| s.pool.as_ref()?.upgrade())
                        .collect()
                };
                // Each pool looks again at its waiters, one lock at a time.
                for pool in pools {
                    pool.dispatch_now();
                }
            }
        });
    }
}

impl Seat {
    /// Whether its pool may start a request now, with `serving` in service on its `slots`, and its
    /// oldest waiter queued at `oldest` (an arrival with nobody waiting: now). Only a look: what
    /// if questions (would it fit once sheddable work has yielded?) ask it too. [`Seat::start`]
    /// decides.
    pub(super) fn allows(&self, serving: usize, slots: usize, oldest: Option<Instant>) -> bool {
        if !self.turns.is_on() {
            return true;
        }
        let seats = self.turns.lock();
        self.allowed(&seats, serving, slots, oldest)
    }

    /// Starts a request of its pool if [`Seat::allows`] it, counting it in the same locked step,
    /// so two pools deciding in the same instant cannot both start.
    pub(super) fn start(&self, serving: usize, slots: usize, oldest: Option<Instant>) -> bool {
        if !self.turns.is_on() {
            return true;
        }
        let mut seats = self.turns.lock();
        if !self.allowed(&seats, serving, slots, oldest) {
            return false;
        }
        let started = seats[self.id].started;
        let seat = &mut seats[self.id];
        seat.serving = serving + 1;
        seat.started = if serving == 0 { 1 } else { started + 1 };
        true
    }

    fn allowed(
        &self,
        seats: &[SeatState],
        serving: usize,
        slots: usize,
        oldest: Option<Instant>,
    ) -> bool {
        let mine = oldest.unwrap_or_else(Instant::now);
        let started = seats[self.id].started;
        !seats.iter().enumerate().any(|(i, other)| {
            i != self.id
                && (other.serving > 0
                    || match serving {
                        // Between turns: the model with the oldest waiter goes first.
                        0 => other.oldest.is_some_and(|theirs| theirs < mine),
                        // In its turn: a batch of its slots, then none while another waits.
                        _ => other.oldest.is_some() && started >= slots,
                    })
        })
    }

    /// Its pool's state after a change: in service, its oldest waiter that only the turns hold
    /// back, and when its work is expected to be done. Wakes the kicker when that may let another
    /// pool start.
    pub(super) fn update(&self, serving: usize, oldest: Option<Instant>, done_at: Option<Instant>) {
        let mut seats = self.turns.lock();
        let seat = &mut seats[self.id];
        let was = (seat.serving, seat.oldest);
        seat.serving = serving;
        seat.oldest = oldest;
        seat.done_at = done_at;
        drop(seats);
        // Its turn ended, or its waiters left or changed: others may go.
        let freed = was.0 > 0 && serving == 0;
        let waiters_changed = was.1 != oldest;
        if self.turns.is_on() && (freed || waiters_changed) {
            self.turns.inner.kick.notify_one();
        }
    }

    /// While turns are taken: seconds until the other models' work in service and waiting is done,
    /// one model after the other (what a request arriving now for this pool waits behind).
    pub(super) fn ahead(&self, now: Instant) -> f64 {
        if !self.turns.is_on() {
            return 0.0;
        }
        self.turns
            .lock()
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.id)
            .filter_map(|(_, s)| s.done_at)
            .map(|at| at.saturating_duration_since(now).as_secs_f64())
            .sum()
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut seats = self.turns.lock();
        if let Some(s) = seats.get_mut(self.id) {
            s.serving = 0;
            s.oldest = None;
            s.done_at = None;
            s.pool = None;
        }
    }
}
