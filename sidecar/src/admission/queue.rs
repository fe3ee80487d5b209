//! Slots and the bounded priority queue in front of them: waiters are served in (priority, arrival)
//! order, a full queue rejects instead of growing, and a released slot is handed straight to the next
//! waiter under the same lock, so no newcomer can overtake the queue.
//!
//! Everything that must be given back is given back by a `Drop`: a [`SlotGuard`] releases (or hands
//! on) its slot, and a waiting [`Ticket`] that is dropped (client gone, deadline) leaves the queue.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::GateError;
use crate::metrics as m;

/// Weight of the newest sample in the service-time average.
const EWMA_ALPHA: f64 = 0.2;
/// Assumed service time until the first request has been measured.
const INITIAL_SERVICE_SECONDS: f64 = 1.0;
/// Upper bound of any Retry-After we hand out.
const MAX_RETRY_AFTER_SECONDS: u64 = 3600;

#[derive(Clone)]
pub struct Admission {
    shared: Arc<Shared>,
}

struct Shared {
    slots: usize,
    capacity: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    busy: usize,
    /// Keyed by (priority, arrival sequence): the first entry is served next, the last is displaced first.
    waiters: BTreeMap<(i64, u64), oneshot::Sender<Grant>>,
    next_seq: u64,
    closed: bool,
    service_ewma: Option<f64>,
}

/// What a waiter is told when it leaves the queue other than by timing out.
#[derive(Debug)]
enum Grant {
    Slot,
    Displaced { retry_after: u64 },
    ShuttingDown { retry_after: u64 },
}

/// A point-in-time view for /status and for Retry-After.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueStats {
    pub slots: usize,
    pub busy: usize,
    pub depth: usize,
    pub capacity: usize,
    pub service_seconds: f64,
    pub closed: bool,
}

impl QueueStats {
    /// Seconds until the work already admitted (busy slots and every waiter) has drained:
    /// `(busy + queued) * service_time / slots`.
    pub fn drain_seconds(&self) -> f64 {
        (self.busy + self.depth) as f64 * self.service_seconds / self.slots as f64
    }
}

impl Admission {
    pub fn new(slots: usize, capacity: usize) -> Self {
        Admission {
            shared: Arc::new(Shared {
                slots,
                capacity,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Waits for a slot until `deadline`. Returns the slot and how long the request queued.
    ///
    /// Cancel-safe: dropping the future while queued removes the waiter at once, and a slot granted
    /// in the same instant is handed on rather than lost.
    pub async fn acquire(
        &self,
        priority: i64,
        deadline: Instant,
    ) -> Result<(SlotGuard, Duration), GateError> {
        let arrived = Instant::now();
        let mut ticket = match self.enqueue(priority)? {
            Entry::Admitted(slot) => return Ok((slot, Duration::ZERO)),
            Entry::Queued(ticket) => ticket,
        };
        let grant = match tokio::time::timeout_at(deadline, &mut ticket.rx).await {
            Ok(Ok(grant)) => grant,
            // The sender is only dropped unsent by a leaked ticket; treat it like a shutdown.
            Ok(Err(_)) => Grant::ShuttingDown { retry_after: 1 },
            Err(_) => match ticket.leave() {
                Some(grant) => grant,
                None => return Err(GateError::QueueTimeout(arrived.elapsed())),
            },
        };
        ticket.resolved = true;
        match grant {
            // Granted in the same instant as the deadline passed: the promise was "never forwarded
            // after the timeout", so the slot goes straight on to the next waiter.
            Grant::Slot if Instant::now() > deadline => {
                drop(self.guard());
                Err(GateError::QueueTimeout(arrived.elapsed()))
            }
            Grant::Slot => Ok((self.guard(), arrived.elapsed())),
            Grant::Displaced { retry_after } => Err(GateError::Displaced { retry_after }),
            Grant::ShuttingDown { retry_after } => Err(GateError::ShuttingDown { retry_after }),
        }
    }

    fn enqueue(&self, priority: i64) -> Result<Entry, GateError> {
        let mut st = self.lock();
        if st.closed {
            return Err(GateError::ShuttingDown { retry_after: 1 });
        }
        if st.busy < self.shared.slots && st.waiters.is_empty() {
            st.busy += 1;
            self.publish(&st);
            return Ok(Entry::Admitted(self.guard()));
        }
        if st.waiters.len() >= self.shared.capacity {
            let retry_after = self.retry_after(&st);
            let victim = st.waiters.last_key_value().map(|(key, _)| *key);
            match victim {
                // Strictly more urgent: the least urgent, most recently queued waiter gives way.
                Some(key) if priority < key.0 => {
                    if let Some(tx) = st.waiters.remove(&key) {
                        let _ = tx.send(Grant::Displaced { retry_after });
                    }
                }
                _ => {
                    return Err(GateError::QueueFull {
                        depth: st.waiters.len(),
                        retry_after,
                    })
                }
            }
        }
        let key = (priority, st.next_seq);
        st.next_seq += 1;
        let (tx, rx) = oneshot::channel();
        st.waiters.insert(key, tx);
        self.publish(&st);
        Ok(Entry::Queued(Ticket {
            admission: self.clone(),
            key,
            rx,
            resolved: false,
        }))
    }

    /// Turns every waiter away and refuses new ones; slots already held drain normally.
    pub fn close(&self, retry_after: u64) {
        let mut st = self.lock();
        st.closed = true;
        for (_, tx) in std::mem::take(&mut st.waiters) {
            let _ = tx.send(Grant::ShuttingDown { retry_after });
        }
        self.publish(&st);
    }

    pub fn stats(&self) -> QueueStats {
        self.stats_of(&self.lock())
    }

    fn stats_of(&self, st: &State) -> QueueStats {
        QueueStats {
            slots: self.shared.slots,
            busy: st.busy,
            depth: st.waiters.len(),
            capacity: self.shared.capacity,
            service_seconds: st.service_ewma.unwrap_or(INITIAL_SERVICE_SECONDS),
            closed: st.closed,
        }
    }

    /// Seconds until the work already admitted (busy slots and every waiter) has drained:
    /// `ceil((busy + queued) * service_ewma / slots)`, clamped to `1..=3600`.
    fn retry_after(&self, st: &State) -> u64 {
        let secs = self.stats_of(st).drain_seconds().ceil();
        (secs as u64).clamp(1, MAX_RETRY_AFTER_SECONDS)
    }

    fn guard(&self) -> SlotGuard {
        SlotGuard {
            admission: self.clone(),
            started: Instant::now(),
            completed: false,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-updated in a way that matters
        // more than stopping service would, so keep serving.
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives a slot back: straight to the most urgent waiter, else to the pool.
    fn release(&self, st: &mut State) {
        while let Some((_, tx)) = st.waiters.pop_first() {
            if tx.send(Grant::Slot).is_ok() {
                self.publish(st);
                return;
            }
        }
        st.busy = st.busy.saturating_sub(1);
        self.publish(st);
    }

    fn publish(&self, st: &State) {
        metrics::gauge!(m::QUEUE_DEPTH).set(st.waiters.len() as f64);
        metrics::gauge!(m::SLOTS_BUSY).set(st.busy as f64);
    }
}

enum Entry {
    Admitted(SlotGuard),
    Queued(Ticket),
}

/// A place in the queue. Dropping it unresolved leaves the queue (and hands on a slot granted meanwhile).
struct Ticket {
    admission: Admission,
    key: (i64, u64),
    rx: oneshot::Receiver<Grant>,
    resolved: bool,
}

impl Ticket {
    /// Leaves the queue. Returns the grant if one arrived before we got the lock.
    fn leave(&mut self) -> Option<Grant> {
        let mut st = self.admission.lock();
        if st.waiters.remove(&self.key).is_some() {
            self.resolved = true;
            self.admission.publish(&st);
            return None;
        }
        drop(st);
        self.rx.try_recv().ok()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.resolved {
            return;
        }
        if let Some(grant) = self.leave() {
            if matches!(grant, Grant::Slot) {
                let mut st = self.admission.lock();
                self.admission.release(&mut st);
            }
        }
    }
}

/// One upstream slot, held until the response has been fully streamed or the client has gone.
pub struct SlotGuard {
    admission: Admission,
    started: Instant,
    completed: bool,
}

impl SlotGuard {
    /// Marks the request as served in full, so its duration feeds the service-time estimate.
    pub fn complete(&mut self) {
        self.completed = true;
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
        if self.completed {
            let sample = self.started.elapsed().as_secs_f64();
            st.service_ewma = Some(match st.service_ewma {
                Some(avg) => avg + EWMA_ALPHA * (sample - avg),
                None => sample,
            });
        }
        self.admission.release(&mut st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    #[tokio::test(start_paused = true)]
    async fn serves_by_priority_then_arrival_and_hands_slots_on() {
        let adm = Admission::new(1, 8);
        let (first, _) = adm.acquire(0, far()).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, prio) in [("a5", 5), ("b1", 1), ("c5", 5), ("d1", 1)] {
            let (adm, order) = (adm.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let (slot, _) = adm.acquire(prio, far()).await.unwrap();
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
    async fn full_queue_rejects_or_displaces_the_least_urgent_newest() {
        let adm = Admission::new(1, 2);
        let (_held, _) = adm.acquire(0, far()).await.unwrap();
        let a = tokio::spawn({
            let adm = adm.clone();
            async move { adm.acquire(5, far()).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let b = tokio::spawn({
            let adm = adm.clone();
            async move { adm.acquire(5, far()).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let err = adm.acquire(5, far()).await.err().unwrap();
        assert!(
            matches!(err, GateError::QueueFull { depth: 2, .. }),
            "{err:?}"
        );
        assert!(err.retry_after().unwrap() >= 1);

        let urgent = tokio::spawn({
            let adm = adm.clone();
            async move { adm.acquire(0, far()).await.map(|_| ()) }
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
        let (held, _) = adm.acquire(0, far()).await.unwrap();
        let err = adm
            .acquire(0, Instant::now() + Duration::from_millis(50))
            .await
            .err()
            .unwrap();
        assert!(matches!(err, GateError::QueueTimeout(_)), "{err:?}");

        let waiting = tokio::spawn({
            let adm = adm.clone();
            async move { adm.acquire(0, far()).await.map(|_| ()) }
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
        let (held, _) = adm.acquire(0, far()).await.unwrap();
        let Entry::Queued(ticket) = adm.enqueue(0).unwrap() else {
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
            let (mut slot, _) = adm.acquire(0, far()).await.unwrap();
            tokio::time::sleep(Duration::from_secs(3)).await;
            slot.complete();
        }
        assert!((adm.stats().service_seconds - 3.0).abs() < 0.01);
        let (_held, _) = adm.acquire(0, far()).await.unwrap();
        let _waiting = tokio::spawn({
            let adm = adm.clone();
            async move { adm.acquire(0, far()).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let err = adm.acquire(0, far()).await.err().unwrap();
        // One busy slot and one waiter ahead, 3 s each.
        assert_eq!(err.retry_after(), Some(6));
    }
}
