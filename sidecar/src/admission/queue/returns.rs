//! Places kept for the clients told to come back. A client turned away for a full queue is told
//! when to return (Retry-After); without more, the newcomers that arrive just before it take the
//! places that have freed meanwhile, and the promise fails whenever bursts overlap. So a refusal
//! books a return: from shortly before the client is due until shortly after it (it may wait the
//! whole-second `Retry-After` or the exact `retry-after-ms`), one queue place counts as taken for
//! everyone else, and the client that comes back with the same request (its tenant and its body)
//! takes it.
//!
//! A booking that is not taken lapses at its end: a client that gave up holds a place for at most
//! [`HOLD_BEFORE`] + the time it was told + [`HOLD_AFTER`], and only from [`HOLD_BEFORE`] before
//! it was due.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use tokio::time::Instant;

use super::{Admission, Claim, State};

/// A booked place is held from this long before the client is due (the next burst's newcomers
/// may arrive just before it)...
pub const HOLD_BEFORE: Duration = Duration::from_secs(1);
/// ...until this long after the whole-second `Retry-After` it was told.
pub const HOLD_AFTER: Duration = Duration::from_millis(500);

/// One client told to come back.
pub(super) struct Booking {
    key: u64,
    from: Instant,
    until: Instant,
}

impl Claim {
    /// Who a client told to come back is, when it comes back: its tenant and its request's body.
    fn return_key(&self) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        self.tenant.hash(&mut h);
        self.body.hash(&mut h);
        h.finish()
    }
}

impl Admission {
    /// Books the return of `claim`'s client, told to come back after `retry_after`.
    pub(super) fn book_return(&self, st: &mut State, claim: &Claim, retry_after: Duration) {
        let now = Instant::now();
        let whole =
            Duration::from_secs(retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0));
        let due = now + retry_after;
        st.bookings.push(Booking {
            key: claim.return_key(),
            from: due.checked_sub(HOLD_BEFORE).unwrap_or(now).max(now),
            until: now + whole.max(Duration::from_secs(1)) + HOLD_AFTER,
        });
        let most = self.most_bookings();
        if st.bookings.len() > most {
            let extra = st.bookings.len() - most;
            st.bookings.drain(..extra);
        }
    }

    /// How many clients told to come back are remembered (here and in the return calendar): many
    /// more than the places could ever be kept for are dropped, the oldest first.
    pub(super) fn most_bookings(&self) -> usize {
        4 * (self.slots() + self.shared.capacity) + 64
    }

    /// Whether `claim` is a client coming back as it was told (its booking is taken); drops the
    /// bookings that have lapsed.
    pub(super) fn take_booking(&self, st: &mut State, claim: &Claim, now: Instant) -> bool {
        if st.bookings.is_empty() {
            return false;
        }
        st.bookings.retain(|b| b.until > now);
        let key = claim.return_key();
        match st.bookings.iter().position(|b| b.key == key) {
            Some(i) => {
                st.bookings.remove(i);
                true
            }
            None => false,
        }
    }

    /// Queue places held now for clients due back.
    pub(super) fn held_places(st: &State, now: Instant) -> usize {
        st.bookings
            .iter()
            .filter(|b| b.from <= now && now < b.until)
            .count()
    }
}
