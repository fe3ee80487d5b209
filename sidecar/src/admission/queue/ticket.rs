//! A place in the queue: the [`Ticket`] of an arrival that could not start at once, on which it
//! waits for its slot or for why it was turned away. Dropped unresolved (client gone, deadline), it
//! leaves the queue, and hands on a slot granted in the same instant.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Admission, Claim, Enlisted, Grant, Hold, SlotGuard};
use crate::error::GateError;

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
    /// The place `seq` of `claim`, queued from now; it hears its grant on `rx`.
    pub(super) fn new(
        admission: Admission,
        seq: u64,
        claim: Claim,
        rx: oneshot::Receiver<Grant>,
    ) -> Self {
        Ticket {
            admission,
            seq,
            claim,
            queued: Instant::now(),
            rx,
            resolved: false,
        }
    }

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
