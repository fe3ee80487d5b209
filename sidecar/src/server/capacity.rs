//! Who may hold a connection: the listener's cap, each peer's share of it, and a spare lane where a
//! connection past either is still read briefly, so a health probe is answered whatever other
//! callers hold.
//!
//! A connection under both caps is served as usual ([`Lane::General`]). Any other is accepted into
//! the spare lane ([`Lane::Spare`]): it has [`SPARE_HEAD_TIMEOUT`] to send its request head and serves
//! that one request. A probe path is answered; any other request of a peer past its cap gets 429
//! `too_many_connections`; one that is only past the listener's cap waits for a place, as it would
//! have waited in the kernel's backlog. When the lane is full, its oldest connection that has sent
//! part of a head, or is waiting for a place, is closed for the newcomer; failing those, the oldest
//! that has sent nothing for [`SILENT_GRACE`] since it was first read. A slow head cannot hold a place
//! a probe needs, and a probe, whose head comes in one piece, is answered on the read that brings
//! it, before it could be chosen.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::metrics as m;

/// The time a connection in the spare lane has to send its whole request head: well inside a
/// probe's usual one-second timeout, which the probe's own head takes microseconds of.
pub const SPARE_HEAD_TIMEOUT: Duration = Duration::from_secs(1);
/// The spare lane's places on each listener.
pub const SPARE_CONNECTIONS: usize = 64;
/// A spare-lane connection that has sent nothing since it was first read may be closed for a newer
/// one after this: long enough for a probe's head to follow its connection on a busy machine, short
/// enough that silent connections cannot keep the lane full.
pub const SILENT_GRACE: Duration = Duration::from_millis(100);
/// At most one log line per reason and listener this often; the lines between are counted in the
/// next one (`closed`), every one in the metric.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// Who a connection is from, for the per-peer cap: the address on TCP (each IPv4 address, each
/// IPv6 /64, the least a host is given), the uid on a Unix socket. Loopback peers are peers like
/// any other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerKey {
    Ip(IpAddr),
    Uid(u32),
    /// A Unix peer whose credentials the kernel did not give: all such share one cap.
    Unknown,
}

impl PeerKey {
    /// A request's peer: its TCP address, else its Unix uid.
    pub fn of(addr: Option<IpAddr>, peer: Option<slotgate_sdk::Peer>) -> Self {
        match (addr, peer) {
            (Some(ip), _) => PeerKey::ip(ip),
            (None, Some(p)) => PeerKey::Uid(p.uid),
            (None, None) => PeerKey::Unknown,
        }
    }

    pub fn ip(ip: IpAddr) -> Self {
        PeerKey::Ip(match ip.to_canonical() {
            IpAddr::V6(v6) => IpAddr::V6((v6.to_bits() & !u128::from(u64::MAX)).into()),
            v4 => v4,
        })
    }
}

impl fmt::Display for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerKey::Ip(ip) => write!(f, "{ip}"),
            PeerKey::Uid(uid) => write!(f, "uid:{uid}"),
            PeerKey::Unknown => f.write_str("unknown"),
        }
    }
}

/// Why a connection was closed by a limit: the `reason` label of
/// `slotgate_connections_refused_total` and of the log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A request other than a probe on a connection past its peer's cap: 429, then closed.
    PeerCap,
    /// The first request head did not finish within the header deadline.
    HeaderTimeout,
    /// A spare-lane connection still sending its head (or waiting for a place) closed for a newer one.
    Evicted,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::PeerCap => "peer_cap",
            Refusal::HeaderTimeout => "header_timeout",
            Refusal::Evicted => "evicted",
        }
    }
}

/// One listener's connection limits.
pub struct Limits {
    /// `client` or `admin`: the `listener` label.
    pub listener: &'static str,
    /// Connections served as usual, all of the listener's sockets together.
    pub connections: usize,
    /// The most of them one peer holds.
    pub per_peer: usize,
    /// Paths answered in the spare lane (GET or HEAD).
    pub probes: &'static [&'static str],
}

/// One listener's connections: the cap, the peers' counts, the spare lane.
pub struct Capacity {
    listener: &'static str,
    conns: Arc<Semaphore>,
    per_peer: usize,
    peers: Mutex<HashMap<PeerKey, usize>>,
    probes: &'static [&'static str],
    lane: Mutex<VecDeque<Arc<Spare>>>,
    /// A lane entry became evictable or left: an admission waiting for room looks again.
    lane_changed: Notify,
    quiet: [Quiet; 3],
}

impl Capacity {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Capacity {
            listener: limits.listener,
            conns: Arc::new(Semaphore::new(limits.connections)),
            per_peer: limits.per_peer,
            peers: Mutex::default(),
            probes: limits.probes,
            lane: Mutex::default(),
            lane_changed: Notify::new(),
            quiet: Default::default(),
        })
    }

    /// One permit per connection served as usual: all of them back means no such connection is open.
    pub fn connections(&self) -> Arc<Semaphore> {
        self.conns.clone()
    }

    pub fn listener(&self) -> &'static str {
        self.listener
    }

    /// Whether a request to `path` is a probe this listener answers in the spare lane.
    pub fn is_probe(&self, method: &http::Method, path: &str) -> bool {
        (method == http::Method::GET || method == http::Method::HEAD) && self.probes.contains(&path)
    }

    /// The lane of a connection just accepted from `peer`. Waits only while the spare lane is full
    /// of connections not yet read once (they are read within a scheduler turn).
    pub async fn admit(self: &Arc<Self>, peer: PeerKey) -> Lane {
        let slot = self.take_peer_slot(peer);
        if slot.is_some() {
            if let Ok(permit) = self.conns.clone().try_acquire_owned() {
                return Lane::General(General {
                    _permit: permit,
                    _slot: slot,
                });
            }
        }
        let spare = Arc::new(Spare {
            state: AtomicU8::new(FRESH),
            silent_since: OnceLock::new(),
            peer_capped: slot.is_none(),
            peer,
            evicted: Notify::new(),
            promoted: Mutex::new(None),
        });
        loop {
            let changed = self.lane_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.enter_lane(&spare) {
                Ok(evicted) => {
                    if let Some(old) = evicted {
                        self.refused(Refusal::Evicted, old);
                    }
                    return Lane::Spare(SpareTicket {
                        capacity: self.clone(),
                        spare,
                        _slot: slot,
                    });
                }
                Err(silent_until) => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(silent_until) => {}
                    }
                }
            }
        }
    }

    /// Counts a connection closed by a limit, and says so in the log (at most once a second).
    pub fn refused(&self, why: Refusal, peer: PeerKey) {
        metrics::counter!(m::CONNECTIONS_REFUSED_TOTAL, "listener" => self.listener, "reason" => why.label())
            .increment(1);
        let quiet = &self.quiet[why as usize];
        quiet.held.fetch_add(1, Ordering::Relaxed);
        let mut last = lock(&quiet.last);
        if last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        drop(last);
        let closed = quiet.held.swap(0, Ordering::Relaxed);
        let what = match why {
            Refusal::PeerCap => {
                "the peer holds its --max-connections-per-peer; only probes answered"
            }
            Refusal::HeaderTimeout => "the request head did not arrive within the header deadline",
            Refusal::Evicted => {
                "a slow connection past the connection limits made room for a newer one"
            }
        };
        tracing::warn!(
            listener = self.listener,
            reason = why.label(),
            peer = %peer,
            closed,
            "connection refused: {what}"
        );
    }

    fn take_peer_slot(self: &Arc<Self>, peer: PeerKey) -> Option<PeerSlot> {
        let mut peers = lock(&self.peers);
        let held = peers.entry(peer).or_insert(0);
        if *held >= self.per_peer {
            if *held == 0 {
                peers.remove(&peer);
            }
            return None;
        }
        *held += 1;
        Some(PeerSlot {
            capacity: self.clone(),
            peer,
        })
    }

    /// Puts `spare` at the back of the lane, closing the oldest evictable entry when it is full
    /// (its peer). With no room, when the oldest silent entry's grace ends.
    fn enter_lane(&self, spare: &Arc<Spare>) -> Result<Option<PeerKey>, Instant> {
        let mut lane = lock(&self.lane);
        let mut evicted = None;
        if lane.len() >= SPARE_CONNECTIONS {
            // A slow head first; a silent one only when none is slow, so that a probe whose head
            // is late to follow its connection on a busy machine is the last to go.
            let now = Instant::now();
            let slow = lane.iter().position(|s| s.evict(&[READING, WAITING]));
            let silent_for = |s: &Spare| s.silent_since.get().map(|t| now.duration_since(*t));
            let silent = || {
                lane.iter().position(|s| {
                    silent_for(s).is_some_and(|d| d >= SILENT_GRACE) && s.evict(&[SILENT])
                })
            };
            let Some(at) = slow.or_else(silent) else {
                // Entries not read yet are read within a scheduler turn, and say so (`lane_changed`).
                let first = lane
                    .iter()
                    .filter_map(|s| s.silent_since.get().copied())
                    .min();
                return Err(first.unwrap_or(now) + SILENT_GRACE);
            };
            evicted = lane.remove(at).map(|s| s.peer);
        }
        lane.push_back(spare.clone());
        Ok(evicted)
    }

    fn leave_lane(&self, spare: &Arc<Spare>) {
        let mut lane = lock(&self.lane);
        if let Some(at) = lane.iter().position(|s| Arc::ptr_eq(s, spare)) {
            lane.remove(at);
            drop(lane);
            self.lane_changed.notify_waiters();
        }
    }
}

/// Log lines held back for one reason.
#[derive(Default)]
struct Quiet {
    last: Mutex<Option<Instant>>,
    held: AtomicU64,
}

/// Where a connection is served.
pub enum Lane {
    General(General),
    Spare(SpareTicket),
}

/// A connection under both caps; its places are given back when this is dropped.
pub struct General {
    _permit: OwnedSemaphorePermit,
    _slot: Option<PeerSlot>,
}

/// One of a peer's places; given back when dropped.
struct PeerSlot {
    capacity: Arc<Capacity>,
    peer: PeerKey,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut peers = lock(&self.capacity.peers);
        if let Some(held) = peers.get_mut(&self.peer) {
            *held -= 1;
            if *held == 0 {
                peers.remove(&self.peer);
            }
        }
    }
}

// A spare-lane connection's state. READING and WAITING may be evicted, SILENT after SILENT_GRACE,
// FRESH (not read yet) never; a connection is READING once it has sent bytes that were not a whole
// head, so a head that came whole is never evicted.
const FRESH: u8 = 0;
const SILENT: u8 = 5;
const READING: u8 = 1;
const ANSWERED: u8 = 2;
const WAITING: u8 = 3;
const EVICTED: u8 = 4;

struct Spare {
    state: AtomicU8,
    /// When a read first found nothing.
    silent_since: OnceLock<Instant>,
    /// Its peer was past its cap: only a probe is served.
    peer_capped: bool,
    peer: PeerKey,
    evicted: Notify,
    /// The listener's place it got after waiting, held to the connection's end.
    promoted: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Spare {
    fn evict(&self, from: &[u8]) -> bool {
        let evicted = self.advance(from, EVICTED);
        if evicted {
            self.evicted.notify_one();
        }
        evicted
    }

    fn advance(&self, from: &[u8], to: u8) -> bool {
        from.iter().any(|&f| {
            self.state
                .compare_exchange(f, to, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }
}

/// What to do with the one request of a spare-lane connection.
pub enum SpareRequest {
    /// A probe: answer it.
    Probe,
    /// Its peer is past its cap: 429, counted.
    Refuse,
    /// Past the listener's cap only: wait for a place ([`SpareTicket::promote`]), then serve it.
    Wait,
    /// The lane closed it already.
    Evicted,
}

/// A connection's place in the spare lane; it leaves the lane when this is dropped.
pub struct SpareTicket {
    capacity: Arc<Capacity>,
    spare: Arc<Spare>,
    _slot: Option<PeerSlot>,
}

impl SpareTicket {
    pub fn capacity(&self) -> &Arc<Capacity> {
        &self.capacity
    }

    pub fn peer(&self) -> PeerKey {
        self.spare.peer
    }

    /// A read found the head not whole (`heard`: with some bytes of it): from now on the lane may
    /// close this connection, at once if it has sent bytes, after [`SILENT_GRACE`] if not.
    pub fn reading(&self, heard: bool) {
        let state = self.spare.state.load(Ordering::Acquire);
        let changed = match (state, heard) {
            (FRESH | SILENT, true) => self.spare.advance(&[FRESH, SILENT], READING),
            (FRESH, false) => {
                let _ = self.spare.silent_since.set(Instant::now());
                self.spare.advance(&[FRESH], SILENT)
            }
            _ => false,
        };
        if changed {
            self.capacity.lane_changed.notify_waiters();
        }
    }

    /// The request head is in: what to do with it. Called as hyper hands the request over, so a
    /// probe read whole on its first read was never evictable.
    pub fn request(&self, method: &http::Method, path: &str) -> SpareRequest {
        let (to, then) = if self.capacity.is_probe(method, path) {
            (ANSWERED, SpareRequest::Probe)
        } else if self.spare.peer_capped {
            (ANSWERED, SpareRequest::Refuse)
        } else {
            (WAITING, SpareRequest::Wait)
        };
        if !self.spare.advance(&[FRESH, SILENT, READING], to) {
            return SpareRequest::Evicted;
        }
        if to == WAITING {
            self.capacity.lane_changed.notify_waiters();
        }
        then
    }

    /// Resolves when the lane has closed this connection for another.
    pub async fn evicted(&self) {
        self.spare.evicted.notified().await;
    }

    /// Whether the request is still unanswered and may be dropped at a shutdown.
    pub fn unanswered(&self) -> bool {
        self.spare.state.load(Ordering::Acquire) != ANSWERED
    }

    /// It waited for a place under the listener's cap and got one (and so left the lane).
    pub fn promoted(&self) -> bool {
        lock(&self.spare.promoted).is_some()
    }

    /// A place under the listener's cap, once one is free: the connection leaves the lane and holds
    /// it to its end. `false` if the lane closed it first.
    pub fn promotion(&self) -> impl std::future::Future<Output = bool> + Send + 'static {
        let (capacity, spare) = (self.capacity.clone(), self.spare.clone());
        async move {
            let Ok(permit) = capacity.conns.clone().acquire_owned().await else {
                return false;
            };
            if !spare.advance(&[WAITING], ANSWERED) {
                return false;
            }
            *lock(&spare.promoted) = Some(permit);
            capacity.leave_lane(&spare);
            true
        }
    }
}

impl Drop for SpareTicket {
    fn drop(&mut self) {
        self.capacity.leave_lane(&self.spare);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(connections: usize, per_peer: usize) -> Arc<Capacity> {
        Capacity::new(Limits {
            listener: "test",
            connections,
            per_peer,
            probes: &["/livez"],
        })
    }

    #[test]
    fn an_ipv6_peer_is_its_64_and_a_mapped_ipv4_its_address() {
        let ip = |s: &str| PeerKey::ip(s.parse().unwrap());
        assert_eq!(ip("2001:db8:1:2::1"), ip("2001:db8:1:2:ffff::9"));
        assert_ne!(ip("2001:db8:1:2::1"), ip("2001:db8:1:3::1"));
        assert_eq!(ip("::ffff:10.0.0.7"), ip("10.0.0.7"));
        assert_eq!(ip("2001:db8:1:2::1").to_string(), "2001:db8:1:2::");
    }

    const A: PeerKey = PeerKey::Uid(1);
    const B: PeerKey = PeerKey::Uid(2);

    #[tokio::test]
    async fn a_peer_past_its_cap_gets_the_spare_lane_and_others_still_get_places() {
        let cap = capacity(10, 2);
        let a1 = cap.admit(A).await;
        let a2 = cap.admit(A).await;
        assert!(matches!((&a1, &a2), (Lane::General(_), Lane::General(_))));
        let Lane::Spare(a3) = cap.admit(A).await else {
            panic!("a third connection of a peer capped at 2 is spare");
        };
        assert!(matches!(cap.admit(B).await, Lane::General(_)));
        assert!(matches!(
            a3.request(&http::Method::GET, "/v1/models"),
            SpareRequest::Refuse
        ));
        drop(a1);
        assert!(
            matches!(cap.admit(A).await, Lane::General(_)),
            "a place given back is the peer's again"
        );
    }

    #[tokio::test]
    async fn probes_are_served_in_the_spare_lane() {
        let cap = capacity(1, 1);
        let _a = cap.admit(A).await;
        let Lane::Spare(t) = cap.admit(A).await else {
            panic!("spare")
        };
        assert!(matches!(
            t.request(&http::Method::GET, "/livez"),
            SpareRequest::Probe
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_lane_evicts_its_oldest_slow_head_never_a_whole_one() {
        let cap = capacity(1, 100);
        let general = cap.admit(A).await;
        let mut lane = Vec::new();
        for _ in 0..SPARE_CONNECTIONS {
            let Lane::Spare(t) = cap.admit(A).await else {
                panic!("spare")
            };
            lane.push(t);
        }
        // None has been read yet: a newcomer waits for room.
        let waiting = tokio::time::timeout(SILENT_GRACE * 3, cap.admit(B)).await;
        assert!(waiting.is_err(), "no entry had been read, none may go");
        lane[3].reading(true);
        lane[1].reading(true);
        let Lane::Spare(newcomer) = cap.admit(B).await else {
            panic!("spare")
        };
        tokio::time::timeout(Duration::from_millis(50), lane[1].evicted())
            .await
            .expect("the oldest slow head was closed");
        assert!(matches!(
            lane[1].request(&http::Method::GET, "/livez"),
            SpareRequest::Evicted
        ));
        // The one waiting for a place may go next, but never an answered probe.
        assert!(matches!(
            lane[0].request(&http::Method::GET, "/livez"),
            SpareRequest::Probe
        ));
        assert!(matches!(
            newcomer.request(&http::Method::GET, "/v1/models"),
            SpareRequest::Wait
        ));
        let Lane::Spare(_second) = cap.admit(B).await else {
            panic!("spare")
        };
        tokio::time::timeout(Duration::from_millis(50), lane[3].evicted())
            .await
            .expect("then the next slow head");
        let Lane::Spare(_third) = cap.admit(B).await else {
            panic!("spare")
        };
        drop(general);
        assert!(
            !newcomer.promotion().await,
            "the request waiting for a place was evicted before one came free"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn silent_connections_keep_their_place_only_for_the_grace() {
        let cap = capacity(1, 100);
        let _general = cap.admit(A).await;
        let mut lane = Vec::new();
        for _ in 0..SPARE_CONNECTIONS {
            let Lane::Spare(t) = cap.admit(A).await else {
                panic!("spare")
            };
            lane.push(t);
        }
        let t0 = Instant::now();
        lane[2].reading(false);
        lane[0].reading(false);
        let Lane::Spare(_newcomer) = cap.admit(B).await else {
            panic!("spare")
        };
        assert_eq!(
            t0.elapsed(),
            SILENT_GRACE,
            "a silent connection keeps its place for the grace"
        );
        tokio::time::timeout(Duration::from_millis(1), lane[0].evicted())
            .await
            .expect("the oldest silent connection made room");
        lane[5].reading(true);
        let Lane::Spare(_next) = cap.admit(B).await else {
            panic!("spare")
        };
        tokio::time::timeout(Duration::from_millis(1), lane[5].evicted())
            .await
            .expect("a slow head goes before a silent one, even a younger one");
    }
}
