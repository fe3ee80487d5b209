//! The pool of one model behind llama-server's router: it admits nobody while its model is not
//! loaded (paused: arrivals queue, and every wait estimate counts the expected load time), turns its
//! waiters away when the model fails to load, pauses for an eviction only when idle, and takes
//! turns with the other models' pools while their threads oversubscribe the CPUs (a [`Turn`], which
//! `router::turns` gives it).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Admission, Fairness, Grant, Shared, State};
use crate::metrics as m;

/// A pool's place in the turns the models behind a router take (`router::turns`): whether it may
/// start a request now, and what it tells the others. Without one, a pool starts whenever it has
/// room.
pub trait Turn: Send + Sync {
    /// Whether the pool may start a request now, with `serving` in service on its `slots` and its
    /// oldest waiter queued at `oldest` (an arrival with nobody waiting: now). Only a look: what
    /// if questions ask it too.
    fn allows(&self, serving: usize, slots: usize, oldest: Option<Instant>) -> bool;
    /// Starts a request if [`Turn::allows`] it, counting it in the same step.
    fn start(&self, serving: usize, slots: usize, oldest: Option<Instant>) -> bool;
    /// The pool's state after a change: in service, its oldest waiter that only the turns hold
    /// back, and when its work is expected to be done.
    fn update(&self, serving: usize, oldest: Option<Instant>, done_at: Option<Instant>);
    /// Seconds until the other pools' work, in service and waiting, is done (what an arrival
    /// here waits behind).
    fn ahead(&self, now: Instant) -> f64;
}

/// An [`Admission`] that does not keep its pool alive (what the turns hold of each pool).
pub struct WeakAdmission(std::sync::Weak<Shared>);

impl WeakAdmission {
    pub fn upgrade(&self) -> Option<Admission> {
        self.0.upgrade().map(|shared| Admission { shared })
    }
}

/// The `model`-labelled gauges of one model's pool.
pub(super) struct ModelGauges {
    pub(super) depth: metrics::Gauge,
    pub(super) busy: metrics::Gauge,
}

impl Admission {
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

    /// Admits nobody from now on, whatever is free (its model is not loaded); arrivals queue.
    /// Requests in service finish.
    pub fn pause(&self) {
        let mut st = self.lock();
        st.paused = true;
        self.publish(&mut st);
    }

    /// Takes turns with other pools from now on, in `seat` (see `router::turns`).
    pub fn join_turns(&self, seat: Box<dyn Turn>) {
        let _ = self.shared.turn.set(seat);
    }

    pub fn downgrade(&self) -> WeakAdmission {
        WeakAdmission(Arc::downgrade(&self.shared))
    }

    /// Looks at the waiters again (another pool's turn ended).
    pub fn dispatch_now(&self) {
        let mut st = self.lock();
        self.dispatch(&mut st);
    }

    /// When its oldest waiter queued (the first by arrival).
    pub(super) fn oldest(st: &State) -> Option<Instant> {
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
}
