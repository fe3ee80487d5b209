//! The per-tenant concurrency cap in the queue (see `admission::cap`): a waiter whose tenant has as
//! many requests in service as its cap allows is passed over by the dispatcher, as a waiter of a
//! band at its share of the slots is, so it holds back nobody behind it; the first of its tenant's
//! requests to end lets it in again (a `SlotGuard` drop dispatches). At arrival a tenant over its
//! caps is refused with 429 `tenant_busy`:
//!
//! - with `max_waiting`, when that many of its requests already wait;
//! - with `--tenant-over-cap refuse`, when its requests in service and waiting already reach its
//!   cap: every request it has queued can then start as soon as a slot is free, none waits on the
//!   cap itself.

use std::time::Duration;

use tokio::time::Instant;

use super::drain::MAX_RETRY_AFTER_SECONDS;
use super::{Admission, State, INITIAL_SERVICE_SECONDS};
use crate::admission::claim::Claim;
use crate::error::GateError;

impl Admission {
    /// Whether `claim`'s tenant already has as many requests in service as `claim`'s cap allows,
    /// or its team as many as the team's cap.
    pub(super) fn at_cap(&self, st: &State, claim: &Claim) -> bool {
        claim
            .cap
            .in_service
            .is_some_and(|cap| st.tenants.in_service(&claim.tenant) >= cap)
            || claim
                .team_cap
                .as_ref()
                .is_some_and(|(team, cap)| st.in_service.of_team(team) >= *cap)
    }

    /// At arrival (not admitted at once): 429 `tenant_busy` when `claim`'s tenant is over its caps,
    /// with when one of its requests is expected to leave room.
    pub(super) fn check_cap(&self, st: &State, claim: &Claim) -> Result<(), GateError> {
        let cap = claim.cap;
        if cap.is_none() {
            return Ok(());
        }
        let in_service = st.tenants.in_service(&claim.tenant);
        let waiting = st.tenants.waiting(&claim.tenant);
        let too_many_waiting = cap.waiting.is_some_and(|m| waiting >= m);
        let refused_at_cap = self.shared.fairness.refuse_at_cap
            && cap.in_service.is_some_and(|n| in_service + waiting >= n);
        if !(too_many_waiting || refused_at_cap) {
            return Ok(());
        }
        Err(GateError::TenantBusy {
            in_service,
            waiting,
            retry_after: self.cap_retry_after(st, claim, in_service + waiting),
        })
    }

    /// When a client of `claim`'s tenant, which has `held` requests in service and waiting, should
    /// find room: the time until enough of them are expected to end (each taking the measured
    /// service time from its start) for one more to fit its caps; at least 1 s, at most an hour.
    /// Without a cap on what is in service, its waiters wait for slots, not for the tenant: the
    /// queue's own drain estimate.
    fn cap_retry_after(&self, st: &State, claim: &Claim, held: usize) -> Duration {
        let service = st.service_ewma.unwrap_or(INITIAL_SERVICE_SECONDS);
        let room = match self.shared.fairness.refuse_at_cap {
            true => claim.cap.in_service,
            false => claim
                .cap
                .in_service
                .map(|n| n + claim.cap.waiting.unwrap_or(0)),
        };
        let seconds = room
            .and_then(|room| {
                // Ends it needs: one for each request beyond the room, and one for its own place.
                let needed = (held + 1).saturating_sub(room).max(1);
                st.in_service
                    .kth_end(&claim.tenant, needed, service, Instant::now())
            })
            .unwrap_or_else(|| self.wait_seconds(st));
        let seconds = seconds.clamp(1.0, MAX_RETRY_AFTER_SECONDS as f64);
        Duration::try_from_secs_f64(seconds).unwrap_or(Duration::from_secs(1))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Admission, Entry, Fairness, Ticket};
    use crate::admission::{Claim, TenantCap};
    use crate::error::GateError;
    use tokio::time::Instant;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    /// A claim of `tenant` capped at `in_service` in service and `waiting` waiting.
    fn capped(tenant: &str, in_service: Option<usize>, waiting: Option<usize>) -> Claim {
        Claim {
            cap: TenantCap {
                in_service,
                waiting,
            },
            ..Claim::test(tenant, 0)
        }
    }

    fn pool(slots: usize, refuse_at_cap: bool) -> Admission {
        let fairness = Fairness {
            refuse_at_cap,
            ..Fairness::default()
        };
        Admission::with_fairness(slots, 8, fairness)
    }

    fn queued(e: Entry) -> Ticket {
        match e {
            Entry::Queued(t) => t,
            Entry::Admitted(_) => panic!("admitted, expected to wait"),
        }
    }

    /// Whether `t` is granted its slot within a millisecond.
    async fn granted(t: &mut Ticket) -> Option<super::super::SlotGuard> {
        match tokio::time::timeout(Duration::from_millis(1), t.wait(far())).await {
            Ok(r) => Some(r.unwrap().0),
            Err(_) => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_at_its_tenant_cap_lets_others_pass_and_starts_when_its_tenant_frees() {
        let adm = pool(3, false);
        let a = || capped("a", Some(1), None);
        let Entry::Admitted(a1) = adm.enter(a(), far()).unwrap() else {
            panic!("a free slot and nobody waiting")
        };
        // Two slots free, but `a` is at its cap: its next requests wait, in their order.
        let mut a2 = queued(adm.enter(a(), far()).unwrap());
        let mut a3 = queued(adm.enter(a(), far()).unwrap());
        assert!(granted(&mut a2).await.is_none());
        // Another tenant is not held back by them.
        let Entry::Admitted(b1) = adm.enter(Claim::test("b", 0), far()).unwrap() else {
            panic!("b must pass a's waiters held back by a's cap")
        };
        assert_eq!((adm.stats().serving, adm.stats().depth), (2, 2));
        drop(a1);
        let a2 = granted(&mut a2)
            .await
            .expect("a's first waiter starts when a1 ends");
        assert!(granted(&mut a3).await.is_none(), "a is at its cap again");
        drop(a2);
        let a3 = granted(&mut a3).await.expect("then a's second waiter");
        drop((a3, b1));
        let s = adm.stats();
        assert_eq!((s.busy, s.serving, s.depth), (0, 0, 0));
        assert_eq!(adm.lock().in_service.at_cap(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_team_at_its_cap_holds_back_each_of_its_tenants_and_nobody_else() {
        let adm = pool(4, false);
        let of_team = |tenant: &str| {
            Claim::test(tenant, 0).team_capped(Some((std::sync::Arc::from("research"), 2)))
        };
        let Entry::Admitted(a1) = adm.enter(of_team("alice"), far()).unwrap() else {
            panic!("a free slot")
        };
        let Entry::Admitted(b1) = adm.enter(of_team("bob"), far()).unwrap() else {
            panic!("the team's second")
        };
        // Two slots free, but the team has two in service: its third waits, whoever sends it.
        let mut a2 = queued(adm.enter(of_team("alice"), far()).unwrap());
        assert!(granted(&mut a2).await.is_none());
        let Entry::Admitted(c1) = adm.enter(Claim::test("carol", 0), far()).unwrap() else {
            panic!("carol is in no team: not held back by it")
        };
        drop(b1);
        let a2 = granted(&mut a2)
            .await
            .expect("bob's request ended: the team has room for alice's");
        assert_eq!(adm.lock().in_service.of_team("research"), 2);
        drop((a1, a2, c1));
        let s = adm.stats();
        assert_eq!((s.busy, s.serving, s.depth), (0, 0, 0));
        assert_eq!(adm.lock().in_service.of_team("research"), 0, "nothing kept");
    }

    #[tokio::test(start_paused = true)]
    async fn refuse_turns_a_tenant_at_its_cap_away_with_when_its_request_ends() {
        let adm = pool(2, true);
        let a = || capped("a", Some(1), None);
        let Entry::Admitted(a1) = adm.enter(a(), far()).unwrap() else {
            panic!("a free slot")
        };
        tokio::time::advance(Duration::from_millis(300)).await;
        let err = adm
            .enter(a(), far())
            .err()
            .expect("a at its cap is refused");
        assert!(
            matches!(
                err,
                GateError::TenantBusy {
                    in_service: 1,
                    waiting: 0,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!((err.status(), err.code()), (429, "tenant_busy"));
        // Nothing measured yet: a service time of 1 s, of which a1 has had 0.3 s; at least 1 s.
        assert_eq!(err.retry_after(), Some(1));
        let Entry::Admitted(b1) = adm.enter(Claim::test("b", 0), far()).unwrap() else {
            panic!("b is served beside a")
        };
        drop((a1, b1));
        assert!(matches!(adm.enter(a(), far()), Ok(Entry::Admitted(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn refuse_counts_a_tenants_waiters_against_its_cap() {
        let adm = pool(1, true);
        let (_held, _) = adm.acquire(Claim::test("b", 0), far()).await.unwrap();
        let a = || capped("a", Some(1), None);
        let _a1 = queued(adm.enter(a(), far()).unwrap());
        let err = adm
            .enter(a(), far())
            .err()
            .expect("a1 will take a's one place");
        assert!(
            matches!(err, GateError::TenantBusy { waiting: 1, .. }),
            "{err:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn beyond_max_waiting_a_tenant_is_refused() {
        let adm = pool(1, false);
        let a = || capped("a", Some(1), Some(1));
        let (a1, _) = adm.acquire(a(), far()).await.unwrap();
        let _a2 = queued(adm.enter(a(), far()).unwrap());
        let err = adm.enter(a(), far()).err().expect("one of a's may wait");
        assert!(
            matches!(
                err,
                GateError::TenantBusy {
                    in_service: 1,
                    waiting: 1,
                    ..
                }
            ),
            "{err:?}"
        );
        // Room again once a1 ends and a2 starts: a1's remaining service time, 1 s unmeasured.
        assert_eq!(err.retry_after_ms(), Some(1000));
        drop(a1);
        let s = adm.stats();
        assert_eq!((s.serving, s.depth), (1, 0), "a2 started");
    }
}
