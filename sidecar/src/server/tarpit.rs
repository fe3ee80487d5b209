//! Slow answers for a peer that keeps being refused (docs/security.md#made-up-key-floods): a caller
//! refused before anything is charged (no key, a made-up or revoked one, a network not allowed,
//! credentials read two ways) costs slotgate microseconds, so a flood of them runs as fast as the
//! flooder can send, and takes the CPU from the callers it serves. Each peer (an IPv4 address, an
//! IPv6 /64, a Unix uid) may be refused `--refusal-burst` times at once (100) and
//! `--refusal-rate` times a second after (20); beyond that its refusals are sent [`DELAY`] late. Waiting costs no CPU, and a flooder's
//! connections then send one request a second each. A peer's served requests are never delayed, and
//! the served path never reads this table: a refusal calls [`hold`], on the one table of the
//! process.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::server::capacity::PeerKey;

/// How late a refusal beyond them is sent.
pub const DELAY: Duration = Duration::from_secs(1);
/// The most peers remembered; past it, those back to a full burst are forgotten first.
const MAX_PEERS: usize = 16_384;

/// The process's table (one slotgate, one table: the client and admin listeners share it), set at
/// start ([`configure`]).
static TARPIT: std::sync::OnceLock<Tarpit> = std::sync::OnceLock::new();

/// Sets the burst and rate of every peer (once, at start; a rate of 0 holds nothing back).
pub fn configure(burst: u32, rate: f64) {
    let _ = TARPIT.set(Tarpit::new(f64::from(burst), rate));
}

/// Holds a refusal of `peer` back when it is past its burst; counted in
/// `slotgate_refusals_delayed_total`.
pub async fn hold(peer: PeerKey) {
    let Some(t) = TARPIT.get().filter(|t| t.rate > 0.0) else {
        return;
    };
    if let Some(d) = t.delay(peer, Instant::now()) {
        metrics::counter!(crate::metrics::REFUSALS_DELAYED_TOTAL).increment(1);
        tokio::time::sleep(d).await;
    }
}

/// Each peer's refusals: what is left of its burst, and when that was reckoned.
#[derive(Debug)]
pub struct Tarpit {
    peers: Mutex<HashMap<PeerKey, (f64, Instant)>>,
    burst: f64,
    rate: f64,
}

impl Tarpit {
    pub fn new(burst: f64, rate: f64) -> Tarpit {
        Tarpit {
            peers: Mutex::new(HashMap::new()),
            burst,
            rate,
        }
    }

    /// A refusal of `peer` at `now`: how long to hold it back, if at all.
    pub fn delay(&self, peer: PeerKey, now: Instant) -> Option<Duration> {
        let mut peers = self
            .peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if peers.len() >= MAX_PEERS && !peers.contains_key(&peer) {
            let before = peers.len();
            peers.retain(|_, (left, at)| self.refilled(*left, *at, now) < self.burst);
            if peers.len() >= MAX_PEERS {
                peers.clear();
            }
            metrics::counter!(crate::metrics::STATE_EVICTED_TOTAL, "kind" => "refused_peers")
                .increment((before - peers.len()) as u64);
        }
        let (left, at) = peers.entry(peer).or_insert((self.burst, now));
        *left = self.refilled(*left, *at, now);
        *at = now;
        if *left >= 1.0 {
            *left -= 1.0;
            return None;
        }
        Some(DELAY)
    }

    fn refilled(&self, left: f64, at: Instant, now: Instant) -> f64 {
        (left + now.saturating_duration_since(at).as_secs_f64() * self.rate).min(self.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_past_its_burst_is_held_back_until_it_refills_and_others_are_not() {
        let t = Tarpit::new(100.0, 20.0);
        let now = Instant::now();
        let a = PeerKey::ip("10.0.0.1".parse().unwrap());
        let b = PeerKey::Uid(1000);
        for _ in 0..100 {
            assert_eq!(t.delay(a, now), None);
        }
        assert_eq!(t.delay(a, now), Some(DELAY));
        assert_eq!(t.delay(b, now), None, "another peer has its own burst");
        let later = now + Duration::from_millis(100);
        assert_eq!(t.delay(a, later), None, "0.1 s refills two");
        assert_eq!(t.delay(a, later), None);
        assert_eq!(t.delay(a, later), Some(DELAY));
    }

    #[test]
    fn the_table_stays_bounded() {
        let t = Tarpit::new(1.0, 1.0);
        let now = Instant::now();
        for i in 0..(MAX_PEERS as u32 + 10) {
            t.delay(PeerKey::Uid(i), now);
        }
        assert!(t.peers.lock().unwrap().len() <= MAX_PEERS);
    }
}
