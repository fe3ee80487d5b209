//! Sheddable work yields its slot. With `--sheddable-priority P`, a request of priority `P` or
//! less urgent (greater) that holds slots is *sheddable*: when a request more urgent than `P`
//! waits next and does not fit beside what is in service, sheddable requests are told to yield
//! (the least urgent first, those that have not begun their answer first, then the most recently
//! started), as many as it takes for the urgent one to fit, and no more.
//!
//! What a told request does is the request path's: before its first byte it closes its upstream
//! connection and goes back to its place in the queue ([`SlotGuard::requeue`]); after it, its
//! stream is ended with an error event. Its slots are given back when its guard drops, as for a
//! client that left. Until then they count as being freed, so the same wait never sheds twice.
//!
//! Never shed: for another sheddable request, or for one it would be served before once back in
//! the queue (by priority after aging, which counts the time it waited, not its time in service);
//! the same request again within [`SHED_GUARD`] of its last shed (the queue is looked at again when
//! the guard time is over); a request already shed [`MAX_REQUEUES`] times (it keeps its slot from
//! then on); a request whose answer outlives its connection (a conversation, `X-Conversation-Id`:
//! closing the connection would not stop llama-server).

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Admission, Claim, Grant, Hold, SlotGuard, State, Ticket, Waiter};
use crate::metrics as m;

/// The shortest time between two sheds of one request: no thrash.
pub const SHED_GUARD: Duration = Duration::from_secs(2);
/// Times a request may be shed before its first byte and go back to the queue; then it is no
/// longer sheddable.
pub const MAX_REQUEUES: u32 = 3;

/// What a request told to yield hears.
#[derive(Debug, Clone, Copy)]
pub struct Shed {
    /// When to come back, for a request ended after its first byte (its client is told).
    pub retry_after: Duration,
}

/// A sheddable request in service.
pub(super) struct Running {
    priority: i64,
    /// Its priority after aging by the time it waited, what it would be back in the queue.
    aged: i64,
    started: Instant,
    /// Its answer has begun: shed, it ends with an error rather than going back to the queue.
    answered: bool,
    hold: Hold,
    cost: u64,
    /// Not shed before then (its last shed plus the guard time).
    not_before: Instant,
    tx: oneshot::Sender<Shed>,
}

/// Held by a sheddable request's guard: how it hears it must yield, and what it takes back to the
/// queue.
pub(super) struct Yielding {
    pub(super) rx: Option<oneshot::Receiver<Shed>>,
    claim: Claim,
    /// Its place by arrival, and how long it waited before it was given its slots (its aging
    /// goes on from there, back in the queue).
    seq: u64,
    waited: Duration,
}

/// Slots, pool tokens and requests being given back by requests told to yield.
#[derive(Default, Clone, Copy)]
pub(super) struct Freed {
    pub(super) slots: usize,
    pub(super) kv: u64,
    pub(super) serving: usize,
}

impl Freed {
    fn add(&mut self, h: &Hold) {
        self.slots += h.slots;
        self.kv += h.kv;
        self.serving += 1;
    }
}

impl Admission {
    /// Whether a request of `priority` may be shed.
    pub(super) fn is_sheddable(&self, priority: i64) -> bool {
        self.shared
            .fairness
            .shed_from
            .is_some_and(|p| priority >= p)
    }

    /// Registers `claim`, just taken into service with `hold`, as sheddable when it is one: returns
    /// its id (what its guard gives back) and how it hears it must yield.
    pub(super) fn enlist(
        &self,
        st: &mut State,
        claim: &Claim,
        hold: Hold,
        seq: u64,
        queued: Instant,
    ) -> Option<(u64, Box<Yielding>)> {
        if !self.is_sheddable(claim.priority) || claim.shed >= MAX_REQUEUES || claim.keeps_slot {
            return None;
        }
        let now = Instant::now();
        let waited = now.saturating_duration_since(queued);
        let (tx, rx) = oneshot::channel();
        let id = st.next_shed_id;
        st.next_shed_id += 1;
        st.sheddable.insert(
            id,
            Running {
                priority: claim.priority,
                aged: self.aged(claim.priority, waited),
                started: now,
                answered: false,
                hold,
                cost: claim.cost,
                not_before: claim.shed_at.map_or(now, |at| at + SHED_GUARD),
                tx,
            },
        );
        Some((
            id,
            Box::new(Yielding {
                rx: Some(rx),
                claim: claim.clone(),
                seq,
                waited,
            }),
        ))
    }

    /// What requests told to yield are still giving back.
    fn freeing(st: &State) -> Freed {
        let mut f = Freed::default();
        for (h, _) in st.freeing.values() {
            f.add(h);
        }
        f
    }

    /// Tells sheddable requests to yield when the waiter served next is more urgent than
    /// sheddable and does not fit beside what is in service (and what is being freed already),
    /// but would once they have gone.
    pub(super) fn shed_for_next(&self, st: &mut State) {
        if st.sheddable.is_empty() {
            return;
        }
        let now = Instant::now();
        let Some(seq) = self.next_waiter(st, now) else {
            return;
        };
        let Some(w) = st.waiters.get(&seq) else {
            return;
        };
        if self.is_sheddable(w.claim.priority) {
            return;
        }
        // A victim back in the queue must come after it, or it would take its slots back.
        let urgent = self.effective(w, now);
        match self.victims(st, &w.claim, urgent, now) {
            Ok(victims) => self.tell_to_yield(st, victims),
            // Not enough yields now: look again when a victim held back by its guard time may.
            Err(Some(at)) => self.wake_at(st, at),
            Err(None) => {}
        }
    }

    /// The sheddable requests less urgent than `urgent` whose going lets `claim` fit: the least
    /// harm first, and no more than it takes (none when it fits already). `Err` when those that may
    /// yield now are not enough, with when one its guard time holds back may.
    fn victims(
        &self,
        st: &State,
        claim: &Claim,
        urgent: i64,
        now: Instant,
    ) -> Result<Vec<(u64, Hold)>, Option<Instant>> {
        let mut freed = Self::freeing(st);
        if self.fits_beside(st, claim, freed) {
            return Ok(Vec::new());
        }
        let mut candidates: Vec<(&u64, &Running)> = st
            .sheddable
            .iter()
            .filter(|(_, r)| r.not_before <= now && r.aged > urgent)
            .collect();
        // The least harm first: not yet answering, least urgent, most recently started.
        candidates.sort_by(|(_, a), (_, b)| {
            a.answered
                .cmp(&b.answered)
                .then(b.priority.cmp(&a.priority))
                .then(b.started.cmp(&a.started))
        });
        let mut victims = Vec::new();
        for (id, r) in candidates {
            freed.add(&r.hold);
            victims.push((*id, r.hold));
            if self.fits_beside(st, claim, freed) {
                break;
            }
        }
        if !self.fits_beside(st, claim, freed) {
            return Err(st
                .sheddable
                .values()
                .filter(|r| r.not_before > now && r.aged > urgent)
                .map(|r| r.not_before)
                .min());
        }
        self.fewest(st, claim, &mut victims);
        Ok(victims)
    }

    /// No more than it takes: one picked early whose share the later ones cover keeps its slot.
    fn fewest(&self, st: &State, claim: &Claim, victims: &mut Vec<(u64, Hold)>) {
        let mut i = 0;
        while victims.len() > 1 && i < victims.len() {
            let without = victims.iter().enumerate().filter(|(j, _)| *j != i).fold(
                Self::freeing(st),
                |mut f, (_, (_, h))| {
                    f.add(h);
                    f
                },
            );
            match self.fits_beside(st, claim, without) {
                true => {
                    victims.remove(i);
                }
                false => i += 1,
            }
        }
    }

    /// Tells `victims` to yield: what they hold counts as being freed from now on.
    fn tell_to_yield(&self, st: &mut State, victims: Vec<(u64, Hold)>) {
        for (id, _) in victims {
            let Some(r) = st.sheddable.remove(&id) else {
                continue;
            };
            st.freeing.insert(id, (r.hold, r.cost));
            let retry_after = match r.answered {
                true => self.retry_after(st, r.cost),
                false => Duration::ZERO,
            };
            tracing::info!(
                priority = r.priority,
                answered = r.answered,
                slots = r.hold.slots,
                "shedding a sheddable request for a more urgent one"
            );
            let _ = r.tx.send(Shed { retry_after });
        }
    }

    /// Charged tokens in service that would not be ahead of `claim`: what is yielding already, and,
    /// for a request more urgent than sheddable, the sheddable work less urgent than it (it would
    /// yield to it). The wait estimates behind a refusal at arrival leave them out, or an urgent
    /// request would be refused for the very work that gives way to it.
    /// Returns their tokens and how many requests they are.
    pub(super) fn yielding_to(&self, st: &State, claim: &Claim) -> (f64, usize) {
        let mut tokens: u64 = st.freeing.values().map(|(_, cost)| cost).sum();
        let mut n = st.freeing.len();
        if !self.is_sheddable(claim.priority) {
            for r in st.sheddable.values().filter(|r| r.aged > claim.priority) {
                tokens += r.cost;
                n += 1;
            }
        }
        (tokens as f64, n)
    }

    /// Looks at the waiters again at `at` (once per instant: an earlier look already due covers
    /// it).
    fn wake_at(&self, st: &mut State, at: Instant) {
        if st.shed_wake.is_some_and(|due| due <= at) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        st.shed_wake = Some(at);
        let admission = self.clone();
        rt.spawn(async move {
            tokio::time::sleep_until(at).await;
            let mut st = admission.lock();
            if st.shed_wake == Some(at) {
                st.shed_wake = None;
            }
            admission.dispatch(&mut st);
        });
    }

    /// Forgets guard `id`: in service no more (dropped), or given back.
    pub(super) fn discharge(&self, st: &mut State, id: u64) {
        if st.sheddable.remove(&id).is_none() {
            st.freeing.remove(&id);
        }
    }
}

impl SlotGuard {
    /// Its answer has begun: the response head is about to go to the client. A stream shed from
    /// now on is ended with an error rather than queued again. A whole answer is sheddable no
    /// more: llama-server has finished it, so ending it would free nothing and lose the answer.
    ///
    /// `false` when the request was told to yield before this, in the same instant the head came
    /// (nothing has gone to the client: it is to be queued again, [`SlotGuard::try_shed`] has the
    /// word). Decided under the lock that shedding takes, so the two cannot cross.
    pub fn answering(&mut self, stream: bool) -> bool {
        let Some(id) = self.shed_id else {
            return true;
        };
        let mut st = self.admission.lock();
        if st.freeing.contains_key(&id) {
            return false;
        }
        match stream {
            true => {
                if let Some(r) = st.sheddable.get_mut(&id) {
                    r.answered = true;
                }
            }
            false => {
                st.sheddable.remove(&id);
                drop(st);
                self.unlisted();
            }
        }
        true
    }

    /// Keeps its slots whatever comes: its end is no longer this request's to hasten (a finished
    /// answer, or one handed to the quarantine, which alone decides when its slots are free).
    /// One told to yield already goes on giving them back.
    pub fn no_longer_sheddable(&mut self) {
        let Some(id) = self.shed_id else {
            return;
        };
        let removed = self.admission.lock().sheddable.remove(&id).is_some();
        if removed {
            self.unlisted();
        }
    }

    /// Sheddable no more: nothing left to hear or give back.
    fn unlisted(&mut self) {
        self.shed_id = None;
        self.yielding = None;
    }

    /// Ready once the request is told to yield its slot (never, for one that is not sheddable).
    pub fn poll_shed(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Shed> {
        use std::future::Future;
        let Some(rx) = self.yielding.as_mut().and_then(|y| y.rx.as_mut()) else {
            return std::task::Poll::Pending;
        };
        match std::pin::Pin::new(rx).poll(cx) {
            std::task::Poll::Ready(Ok(shed)) => {
                self.told();
                std::task::Poll::Ready(shed)
            }
            std::task::Poll::Ready(Err(_)) => {
                self.told();
                std::task::Poll::Pending
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }

    /// Waits until the request is told to yield (forever, for one that is not sheddable).
    pub async fn shed(&mut self) -> Shed {
        std::future::poll_fn(|cx| self.poll_shed(cx)).await
    }

    /// Whether the request has been told to yield already.
    pub fn try_shed(&mut self) -> Option<Shed> {
        let rx = self.yielding.as_mut()?.rx.as_mut()?;
        let shed = rx.try_recv().ok()?;
        self.told();
        Some(shed)
    }

    fn told(&mut self) {
        if let Some(y) = self.yielding.as_mut() {
            y.rx = None;
        }
    }

    /// Shed before its first byte: back to its place in the queue (by arrival and first queuing,
    /// however full the queue), having been served nothing. Its slots go to the next waiter
    /// `grace` from now, once llama-server has seen the closed connection. `Err` for a request
    /// that is not sheddable (it keeps its slot: given back).
    pub fn requeue(mut self, grace: Duration) -> Result<Ticket, Box<SlotGuard>> {
        let Some(y) = self.yielding.take() else {
            return Err(Box::new(self));
        };
        self.settle(0);
        let mut claim = y.claim;
        let now = Instant::now();
        claim.shed += 1;
        claim.shed_at = Some(now);
        // It started in time once; it comes back as background work, by the queue timeout alone.
        claim.deadline = None;
        let admission = self.admission.clone();
        let (tx, rx) = oneshot::channel();
        {
            let mut st = admission.lock();
            if st.closed {
                // Shutting down: it is answered as the waiters were when the queue closed.
                let _ = tx.send(Grant::ShuttingDown {
                    retry_after: st.closed_retry_after,
                });
            } else {
                st.tenants.enqueue(&claim.tenant);
                st.waiters.insert(
                    y.seq,
                    Waiter {
                        claim: claim.clone(),
                        // Aged by the time it waited, not by its time in service.
                        queued: now.checked_sub(y.waited).unwrap_or(now),
                        tx,
                    },
                );
                admission.publish(&mut st);
            }
        }
        metrics::counter!(m::SHED_TOTAL, "stage" => "before_first_byte").increment(1);
        admission
            .shared
            .shed_requeued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.release_after(grace);
        Ok(Ticket::new(admission, y.seq, claim, rx))
    }

    /// Shed after its first byte: its answer is being ended (counted).
    pub fn ended_by_shed(&self) {
        metrics::counter!(m::SHED_TOTAL, "stage" => "after_first_byte").increment(1);
        self.admission
            .shared
            .shed_ended
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}
