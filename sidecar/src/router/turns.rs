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
//! Each pool keeps a [`Seat`], its [`Turn`]: what it has in service and its oldest waiter,
//! published under its own lock each time they change. A seat whose change may let another pool start wakes the kicker,
//! a task that dispatches every pool one at a time (never two pools' locks at once).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::admission::{Admission, Turn, WeakAdmission};

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

    /// Seats `admission`'s pool in the turns. The kicker starts with the first seat (it needs a
    /// runtime).
    pub fn seat(&self, admission: &Admission) {
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
        admission.join_turns(Box::new(Seat {
            turns: self.clone(),
            id,
        }));
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
    /// [`Turn::allows`] with the seats in hand.
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
}

impl Turn for Seat {
    /// Whether its pool may start a request now, with `serving` in service on its `slots`, and its
    /// oldest waiter queued at `oldest` (an arrival with nobody waiting: now). Only a look: what
    /// if questions (would it fit once sheddable work has yielded?) ask it too. [`Turn::start`]
    /// decides.
    fn allows(&self, serving: usize, slots: usize, oldest: Option<Instant>) -> bool {
        if !self.turns.is_on() {
            return true;
        }
        let seats = self.turns.lock();
        self.allowed(&seats, serving, slots, oldest)
    }

    /// Starts a request of its pool if [`Turn::allows`] it, counting it in the same locked step,
    /// so two pools deciding in the same instant cannot both start.
    fn start(&self, serving: usize, slots: usize, oldest: Option<Instant>) -> bool {
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

    /// Its pool's state after a change: in service, its oldest waiter that only the turns hold
    /// back, and when its work is expected to be done. Wakes the kicker when that may let another
    /// pool start.
    fn update(&self, serving: usize, oldest: Option<Instant>, done_at: Option<Instant>) {
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
    fn ahead(&self, now: Instant) -> f64 {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::Turns;
    use crate::admission::{Admission, Claim, Entry, Fairness, SlotGuard};

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    /// One tenant's claim at `priority`.
    fn c(priority: i64) -> Claim {
        Claim::test("t", priority)
    }

    /// Two models' pools of two slots each, taking turns (or not).
    fn two_models(on: bool) -> (Turns, Admission, Admission) {
        let turns = Turns::new();
        let pools = ["a", "b"].map(|m| {
            let p = Admission::for_model(2, 8, Fairness::default(), m);
            p.resume();
            turns.seat(&p);
            p
        });
        turns.set(on);
        let [a, b] = pools;
        (turns, a, b)
    }

    #[tokio::test(start_paused = true)]
    async fn models_taking_turns_never_decode_at_once_and_alternate_by_batches() {
        let (turns, a, b) = two_models(true);
        // a's turn: both its slots.
        let (a1, _) = a.acquire(c(0), far()).await.unwrap();
        let (a2, _) = a.acquire(c(0), far()).await.unwrap();
        // b's estimate counts a's turn: two requests on two slots, 1 s each before any is measured.
        assert!(
            (b.stats().wait_seconds - 1.0).abs() < 0.01,
            "{}",
            b.stats().wait_seconds
        );
        // b waits while a serves, though its own slots are free.
        let bw: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                tokio::spawn(async move { b.acquire(c(0), far()).await.map(|(s, _)| s) })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!((b.stats().busy, b.stats().depth), (0, 2));
        // a ends one: b still waits (a is still decoding), and a admits no more while b waits.
        drop(a1);
        let a3 = {
            let a = a.clone();
            tokio::spawn(async move { a.acquire(c(0), far()).await.map(|(s, _)| s) })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!((a.stats().busy, a.stats().depth), (1, 1), "a's turn ends");
        assert_eq!(b.stats().busy, 0);
        // a's turn over: b's waiters (older than a's) go, both at once.
        drop(a2);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!((a.stats().busy, b.stats().busy), (0, 2));
        let held: Vec<SlotGuard> = futures_util::future::join_all(bw)
            .await
            .into_iter()
            .map(|r| r.unwrap().unwrap())
            .collect();
        // b's turn over: a's waiter goes.
        drop(held);
        let a3 = a3.await.unwrap().unwrap();
        assert_eq!((a.stats().busy, b.stats().busy), (1, 0));
        drop(a3);
        // Off: each pool on its own slots, both at once, and nobody's estimate counts the other's.
        turns.set(false);
        let (a4, _) = a.acquire(c(0), far()).await.unwrap();
        assert_eq!(b.stats().wait_seconds, 0.0);
        drop(a4);
        let (_a, _) = a.acquire(c(0), far()).await.unwrap();
        let (_b, _) = b.acquire(c(0), far()).await.unwrap();
        assert_eq!((a.stats().busy, b.stats().busy), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_model_does_not_hold_back_the_others_turns() {
        let (_turns, a, b) = two_models(true);
        // b is loading: its waiter cannot start, and must not stop a from starting.
        b.pause();
        let bw = {
            let b = b.clone();
            tokio::spawn(async move { b.acquire(c(0), far()).await.map(|(s, _)| s) })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let (a1, _) = a.acquire(c(0), far()).await.unwrap();
        let (a2, _) = a.acquire(c(0), far()).await.unwrap();
        assert_eq!(a.stats().busy, 2);
        // Loaded, b waits for a's turn to end; then it goes.
        b.resume();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(b.stats().busy, 0);
        drop((a1, a2));
        let slot = bw.await.unwrap().unwrap();
        assert_eq!(b.stats().busy, 1);
        drop(slot);
        let s = (a.stats(), b.stats());
        assert_eq!((s.0.busy, s.0.depth, s.1.busy, s.1.depth), (0, 0, 0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_is_a_batch_of_the_models_slots_whatever_the_order_of_arrival() {
        let (_turns, a, b) = two_models(true);
        let wait = |p: &Admission| {
            let p = p.clone();
            tokio::spawn(async move { p.acquire(c(0), far()).await.map(|(s, _)| s) })
        };
        let tick = || tokio::time::sleep(Duration::from_millis(1));
        // a, b, a, b, a: a's turn is a1 and a2 (its two slots); b1 and b2 wait though b1 came before a2.
        let (a1, _) = a.acquire(c(0), far()).await.unwrap();
        let b1 = wait(&b);
        tick().await;
        let (a2, _) = a.acquire(c(0), far()).await.unwrap();
        let b2 = wait(&b);
        tick().await;
        let a3 = wait(&a);
        tick().await;
        assert_eq!(
            (a.stats().busy, a.stats().depth, b.stats().depth),
            (2, 1, 2)
        );
        // a's turn over: b's oldest waiter came before a3, so b's batch runs, both of its slots.
        drop((a1, a2));
        let (b1, b2) = (b1.await.unwrap().unwrap(), b2.await.unwrap().unwrap());
        assert_eq!((a.stats().busy, b.stats().busy, a.stats().depth), (0, 2, 1));
        drop((b1, b2));
        let a3 = a3.await.unwrap().unwrap();
        assert_eq!((a.stats().busy, b.stats().busy), (1, 0));
        drop(a3);
    }

    /// Asking whether an urgent request would fit once sheddable work yields does not count starts
    /// in the models' turns: the turn's batch is not used up by questions.
    #[tokio::test(start_paused = true)]
    async fn what_if_questions_do_not_use_up_a_models_turn() {
        let turns = Turns::new();
        let fair = Fairness {
            shed_from: Some(10),
            ..Fairness::default()
        };
        let a = Admission::for_model(3, 8, fair, "a");
        a.resume();
        turns.seat(&a);
        a.set_pool(Some(1000));
        let b = Admission::for_model(2, 8, Fairness::default(), "b");
        b.resume();
        turns.seat(&b);
        turns.set(true);
        let (mut s1, _) = a.acquire(c(10).holding(1, 900), far()).await.unwrap();
        let (r1, _) = a.acquire(c(0).holding(1, 50), far()).await.unwrap();
        // Needs 500 of the pool: s1 must yield.
        let Entry::Queued(mut u) = a.enter(c(0).holding(1, 500), far()).unwrap() else {
            panic!("the pool is short")
        };
        assert!(s1.try_shed().is_some());
        // Model b waits meanwhile: a's turn is two of its three slots so far.
        let bw = {
            let b = b.clone();
            tokio::spawn(async move { b.acquire(c(0), far()).await.map(|(s, _)| s) })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let back = s1.requeue(Duration::ZERO).ok().unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let got = tokio::time::timeout(Duration::from_millis(5), u.wait(far())).await;
        assert!(
            got.is_ok(),
            "the third start of a's turn was used up by questions"
        );
        drop((r1, back, got));
        let _ = bw.await;
    }
}
