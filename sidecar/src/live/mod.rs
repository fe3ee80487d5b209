//! What is happening now, for `GET /live` on the admin listener and `slotgate top`: every request
//! inside slotgate (its id, endpoint, tenant, phase, tokens so far, age), per-tenant totals (served
//! tokens, refusals by reason) and a minute of per-second history (requests, tokens, 429s, queue
//! waits).
//!
//! The request path writes it at a few points per request: one map insert when it arrives, a few
//! relaxed atomic stores as it moves on, and one short lock with the map removal when it ends. It is
//! read about once a second by whoever watches.

use std::collections::HashMap;
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

use crate::error::Outcome;

pub mod schema;

pub use schema::{History, Rates};

/// Seconds of history kept.
pub const HISTORY_SECONDS: usize = 60;
/// Seconds the rates are averaged over.
pub const RATE_SECONDS: usize = 10;
/// Tenants with totals of their own; later ones share [`OTHER_TENANT`].
const MAX_TENANTS: usize = 1000;
pub const OTHER_TENANT: &str = "other";
/// The tenant of a request refused before it had one (unreadable, say).
pub const NO_TENANT: &str = "-";
/// Queue-wait bins: 0 (under a millisecond), then each 1.2 times the one before, from 1 ms.
const WAIT_BINS: usize = 80;
const WAIT_GROWTH: f64 = 1.2;

/// Where a request is on its way (see `pipeline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Its body being read.
    Reading = 0,
    /// Counted and judged by the policy chain.
    Deciding = 1,
    /// Waiting for a slot.
    Queued = 2,
    /// Sent to llama-server, its answer not begun.
    Upstream = 3,
    /// Its answer flowing to the client.
    Answering = 4,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Reading => "reading",
            Phase::Deciding => "deciding",
            Phase::Queued => "queued",
            Phase::Upstream => "upstream",
            Phase::Answering => "answering",
        }
    }

    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Reading,
            1 => Phase::Deciding,
            2 => Phase::Queued,
            3 => Phase::Upstream,
            _ => Phase::Answering,
        }
    }
}

#[derive(Clone)]
pub struct Live {
    inner: Arc<Inner>,
}

struct Inner {
    started: Instant,
    next: AtomicU64,
    /// Completion tokens generated, counted as they stream (and at the end of a whole answer).
    generated: AtomicU64,
    requests: DashMap<u64, Arc<Request>>,
    totals: Mutex<Totals>,
}

/// One request inside slotgate.
pub struct Request {
    /// Its key in the live view (also the queue's `Claim::tag`).
    pub key: u64,
    pub request_id: http::HeaderValue,
    pub method: http::Method,
    pub path: String,
    pub arrived: Instant,
    phase: AtomicU8,
    tenant: OnceLock<Arc<str>>,
    priority: AtomicI64,
    prompt_tokens: AtomicU64,
    generated: AtomicU64,
    slots: AtomicUsize,
    stream: AtomicBool,
    /// Nanoseconds after arrival it was admitted (given its slot); 0: not yet.
    admitted_after: AtomicU64,
    /// Its own deadline, milliseconds after arrival; 0: none.
    deadline_ms: AtomicU64,
    /// Times it was shed before its first byte and queued again.
    shed: AtomicU32,
    /// Its overload band, once scheduled in one.
    band: OnceLock<Arc<str>>,
    /// Its session, agent, parent agent and conversation, when its client named any.
    lineage: OnceLock<Box<Lineage>>,
}

/// Who in an agent run a request is, as its client's headers say (docs/sessions.md): the
/// session it belongs to, the agent that sent it, the agent that started that one (none for a
/// root agent), and the conversation it resumes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lineage {
    pub session: Option<Box<str>>,
    pub agent: Option<Box<str>>,
    pub parent: Option<Box<str>>,
    pub conversation: Option<Box<str>>,
}

impl Lineage {
    /// Whether the client named none of them.
    pub fn is_empty(&self) -> bool {
        self.session.is_none()
            && self.agent.is_none()
            && self.parent.is_none()
            && self.conversation.is_none()
    }
}

impl Request {
    pub fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Relaxed))
    }

    pub fn set_tenant(&self, tenant: &Arc<str>) {
        let _ = self.tenant.set(tenant.clone());
    }

    pub fn tenant(&self) -> Option<&Arc<str>> {
        self.tenant.get()
    }

    pub fn set_priority(&self, priority: i64) {
        self.priority.store(priority, Ordering::Relaxed);
    }

    pub fn set_prompt_tokens(&self, n: u64) {
        self.prompt_tokens.store(n, Ordering::Relaxed);
    }

    pub fn set_stream(&self, stream: bool) {
        self.stream.store(stream, Ordering::Relaxed);
    }

    pub fn set_deadline(&self, deadline: Duration) {
        let ms = u64::try_from(deadline.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.deadline_ms.store(ms, Ordering::Relaxed);
    }

    pub fn set_band(&self, band: &Arc<str>) {
        let _ = self.band.set(band.clone());
    }

    /// Its session, agent, parent and conversation; an empty lineage is not kept.
    pub fn set_lineage(&self, lineage: Lineage) {
        if !lineage.is_empty() {
            let _ = self.lineage.set(Box::new(lineage));
        }
    }

    pub fn lineage(&self) -> Option<&Lineage> {
        self.lineage.get().map(|l| &**l)
    }

    /// Shed before its first byte (`n` times in all): waiting again.
    pub fn set_shed(&self, n: u32) {
        self.shed.store(n, Ordering::Relaxed);
        self.set_phase(Phase::Queued);
    }

    /// Given its slots again after a shed: the same slots as before.
    pub fn readmitted(&self) {
        self.admitted(self.slots.load(Ordering::Relaxed));
    }

    /// Given its slots (`slots` of them): in service from now.
    pub fn admitted(&self, slots: usize) {
        self.slots.store(slots, Ordering::Relaxed);
        let after = self.arrived.elapsed().as_nanos().max(1);
        self.admitted_after
            .store(u64::try_from(after).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.set_phase(Phase::Upstream);
    }

    fn text_of(&self, field: impl Fn(&Lineage) -> &Option<Box<str>>) -> Option<String> {
        self.lineage()
            .and_then(|l| field(l).as_deref().map(str::to_owned))
    }

    /// What the live view shows of it now.
    pub fn view(&self, now: Instant) -> schema::Request {
        let admitted = self.admitted_after.load(Ordering::Relaxed);
        schema::Request {
            request_id: self.request_id.to_str().unwrap_or("-").to_owned(),
            method: self.method.as_str().to_owned(),
            path: self.path.clone(),
            tenant: self.tenant().map(|t| t.to_string()),
            phase: self.phase().label().to_owned(),
            priority: self.priority.load(Ordering::Relaxed),
            age_seconds: now.saturating_duration_since(self.arrived).as_secs_f64(),
            in_service_seconds: (admitted > 0).then(|| {
                let at = self.arrived + Duration::from_nanos(admitted);
                now.saturating_duration_since(at).as_secs_f64()
            }),
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            generated_tokens: self.generated.load(Ordering::Relaxed),
            slots: self.slots.load(Ordering::Relaxed) as u64,
            stream: self.stream.load(Ordering::Relaxed),
            deadline_ms: Some(self.deadline_ms.load(Ordering::Relaxed)).filter(|ms| *ms > 0),
            shed: u64::from(self.shed.load(Ordering::Relaxed)),
            band: self.band.get().map(|b| b.to_string()),
            session: self.text_of(|l| &l.session),
            agent: self.text_of(|l| &l.agent),
            parent_agent: self.text_of(|l| &l.parent),
            conversation: self.text_of(|l| &l.conversation),
        }
    }
}

/// How one request ended, for the totals.
#[derive(Debug, Clone, Copy)]
pub struct Ended<'a> {
    pub outcome: Outcome,
    pub status: Option<u16>,
    pub tenant: Option<&'a str>,
    /// Prompt plus completion tokens served.
    pub tokens: u64,
    pub completion_tokens: u64,
    /// How long it queued, for a request that was given a slot.
    pub queue_wait: Option<Duration>,
}

/// A request's place in the live view; leaves it when dropped.
pub struct Tracked {
    live: Live,
    request: Arc<Request>,
}

impl Tracked {
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// Tokens generated so far (a stream's text-carrying events); they count in the rates at once.
    pub fn set_generated(&self, n: u64) {
        let before = self.request.generated.swap(n, Ordering::Relaxed);
        let more = n.saturating_sub(before);
        if more > 0 {
            self.live.inner.generated.fetch_add(more, Ordering::Relaxed);
        }
    }

    /// Counts how it ended. Called once, as it ends.
    pub fn end(&self, ended: Ended<'_>) {
        // What the answer reported beyond what was seen streaming (a whole answer: all of it).
        let seen = self.request.generated.load(Ordering::Relaxed);
        let more = ended.completion_tokens.saturating_sub(seen);
        self.live.inner.generated.fetch_add(more, Ordering::Relaxed);
        self.live.record(ended);
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.live.inner.requests.remove(&self.request.key);
    }
}

impl std::ops::Deref for Tracked {
    type Target = Request;
    fn deref(&self) -> &Request {
        &self.request
    }
}

#[derive(Default)]
struct Totals {
    outcomes: [u64; Outcome::ALL.len()],
    tokens: u64,
    tenants: HashMap<Arc<str>, TenantTotals>,
    seconds: Vec<Second>,
    /// The generated-token mark of the last second dropped from `seconds`.
    dropped_mark: u64,
    /// (seconds since start, [`Inner::generated`]) at looks and request ends, at most two a
    /// second, for the last minute: the tokens-per-second rate is measured between two of them.
    marks: std::collections::VecDeque<(f64, u64)>,
}

/// One tenant's totals since start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantTotals {
    pub requests: u64,
    /// Prompt plus completion tokens served.
    pub served_tokens: u64,
    /// Requests refused, by outcome (`queue_full`, `policy_denied`, ...): every outcome but `ok`,
    /// the client's own leaving and llama-server's answers.
    pub refused: HashMap<&'static str, u64>,
}

/// One second of history.
#[derive(Clone)]
struct Second {
    /// Whole seconds since start.
    at: u64,
    requests: u64,
    /// [`Inner::generated`] when this second was last touched.
    generated: u64,
    /// Answers with status 429.
    refused: u64,
    waits: [u32; WAIT_BINS],
}

impl Second {
    fn new(at: u64) -> Second {
        Second {
            at,
            requests: 0,
            generated: 0,
            refused: 0,
            waits: [0; WAIT_BINS],
        }
    }
}

/// A refusal slotgate made itself, counted per tenant by reason.
fn is_refusal(outcome: Outcome) -> bool {
    !matches!(
        outcome,
        Outcome::Ok
            | Outcome::ClientGone
            | Outcome::ClientStalled
            | Outcome::Upstream4xx
            | Outcome::Upstream5xx
            | Outcome::DrainTimeout
    )
}

fn wait_bin(wait: Duration) -> usize {
    let ms = wait.as_secs_f64() * 1e3;
    if ms < 1.0 {
        return 0;
    }
    let bin = 1 + (ms.ln() / WAIT_GROWTH.ln()) as usize;
    bin.min(WAIT_BINS - 1)
}

/// The middle of a bin, in seconds (the geometric middle of its bounds).
fn bin_seconds(bin: usize) -> f64 {
    if bin == 0 {
        return 0.0;
    }
    let low = WAIT_GROWTH.powi(bin as i32 - 1);
    low * WAIT_GROWTH.sqrt() / 1e3
}

/// Everything the live view shows, at one instant.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub uptime: Duration,
    /// Every request inside, oldest first.
    pub requests: Vec<schema::Request>,
    pub outcomes: Vec<(&'static str, u64)>,
    pub tokens: u64,
    pub tenants: Vec<(String, TenantTotals)>,
    pub rates: Rates,
    /// The last [`HISTORY_SECONDS`] whole seconds, oldest first (the current one left out).
    pub history: History,
}

impl Default for Live {
    fn default() -> Self {
        Live::new()
    }
}

impl Live {
    pub fn new() -> Live {
        Live {
            inner: Arc::new(Inner {
                started: Instant::now(),
                next: AtomicU64::new(1),
                generated: AtomicU64::new(0),
                requests: DashMap::new(),
                totals: Mutex::new(Totals::default()),
            }),
        }
    }

    /// A request arrived: it is in the view until the returned [`Tracked`] drops.
    pub fn track(
        &self,
        request_id: &http::HeaderValue,
        method: &http::Method,
        path: &str,
    ) -> Tracked {
        let key = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let request = Arc::new(Request {
            key,
            request_id: request_id.clone(),
            method: method.clone(),
            path: path.to_owned(),
            arrived: Instant::now(),
            phase: AtomicU8::new(Phase::Reading as u8),
            tenant: OnceLock::new(),
            priority: AtomicI64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generated: AtomicU64::new(0),
            slots: AtomicUsize::new(0),
            stream: AtomicBool::new(false),
            admitted_after: AtomicU64::new(0),
            deadline_ms: AtomicU64::new(0),
            shed: AtomicU32::new(0),
            band: OnceLock::new(),
            lineage: OnceLock::new(),
        });
        self.inner.requests.insert(key, request.clone());
        Tracked {
            live: self.clone(),
            request,
        }
    }

    /// The request with this key, while it is inside slotgate.
    pub fn request(&self, key: u64) -> Option<schema::Request> {
        let now = Instant::now();
        self.inner.requests.get(&key).map(|r| r.view(now))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Totals> {
        self.inner.totals.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, ended: Ended<'_>) {
        let now = self.inner.started.elapsed().as_secs();
        let mut t = self.lock();
        let t = &mut *t;
        if let Some(i) = Outcome::ALL.iter().position(|o| *o == ended.outcome) {
            t.outcomes[i] += 1;
        }
        t.tokens += ended.tokens;
        let tenant = ended.tenant.unwrap_or(NO_TENANT);
        let entry = match t.tenants.get_mut(tenant) {
            Some(e) => e,
            None => {
                let name: Arc<str> = match t.tenants.len() < MAX_TENANTS {
                    true => Arc::from(tenant),
                    false => Arc::from(OTHER_TENANT),
                };
                t.tenants.entry(name).or_default()
            }
        };
        entry.requests += 1;
        entry.served_tokens += ended.tokens;
        if is_refusal(ended.outcome) {
            *entry.refused.entry(ended.outcome.label()).or_default() += 1;
        }
        let second = self.touch(t, now);
        second.requests += 1;
        if ended.status == Some(429) {
            second.refused += 1;
        }
        if let Some(wait) = ended.queue_wait {
            second.waits[wait_bin(wait)] += 1;
        }
    }

    /// The second `now` (since start), its generated-token mark brought up to date.
    fn touch<'t>(&self, t: &'t mut Totals, now: u64) -> &'t mut Second {
        if t.seconds.last().is_none_or(|s| s.at != now) {
            t.seconds.push(Second::new(now));
            // One more than the history: the base of its first second's tokens.
            let keep = HISTORY_SECONDS + 2;
            if t.seconds.len() > keep {
                let extra = t.seconds.len() - keep;
                t.dropped_mark = t.seconds[extra - 1].generated;
                t.seconds.drain(..extra);
            }
        }
        let generated = self.inner.generated.load(Ordering::Relaxed);
        let at = self.inner.started.elapsed().as_secs_f64();
        if t.marks.back().is_none_or(|m| at - m.0 >= 0.5) {
            t.marks.push_back((at, generated));
            while t
                .marks
                .front()
                .is_some_and(|m| at - m.0 > HISTORY_SECONDS as f64)
            {
                t.marks.pop_front();
            }
        }
        let second = t.seconds.last_mut().expect("just pushed");
        second.generated = generated;
        second
    }

    /// Tokens generated per second over about the last [`RATE_SECONDS`]: from the newest mark at
    /// least that old (else the oldest, else the start) to now.
    fn generated_rate(&self, t: &Totals) -> f64 {
        let now = self.inner.started.elapsed().as_secs_f64();
        let value = self.inner.generated.load(Ordering::Relaxed);
        let base = t
            .marks
            .iter()
            .rev()
            .find(|m| now - m.0 >= RATE_SECONDS as f64)
            .or(t.marks.front())
            .copied()
            .unwrap_or((0.0, 0));
        let base = match base.0 > 0.0 && t.marks.front().is_some_and(|m| m.0 >= now - 1.0) {
            // Only marks from the last second: from the start instead.
            true => (0.0, 0),
            false => base,
        };
        let span = now - base.0;
        match span >= 0.1 {
            true => value.saturating_sub(base.1) as f64 / span,
            false => 0.0,
        }
    }

    /// Everything, now.
    pub fn snapshot(&self) -> Snapshot {
        let now = Instant::now();
        let mut by_arrival: Vec<(u64, schema::Request)> = (self.inner.requests.iter())
            .map(|r| (r.key, r.view(now)))
            .collect();
        by_arrival.sort_by_key(|r| r.0);
        let requests = by_arrival.into_iter().map(|r| r.1).collect();
        let uptime = self.inner.started.elapsed();
        let current = uptime.as_secs();
        let mut t = self.lock();
        self.touch(&mut t, current);
        let outcomes = Outcome::ALL
            .iter()
            .zip(t.outcomes)
            .map(|(o, n)| (o.label(), n))
            .collect();
        let mut tenants: Vec<(String, TenantTotals)> = t
            .tenants
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        tenants.sort_by(|a, b| a.0.cmp(&b.0));
        // Whole seconds only: the current one is still filling.
        let at = |s: u64| t.seconds.iter().find(|x| x.at == s);
        // Tokens generated in second `s`: its mark less the mark of the second touched before it
        // (a quiet stretch is counted in the second that ends it).
        let generated_in = |s: u64| -> u64 {
            let Some(i) = t.seconds.iter().position(|x| x.at == s) else {
                return 0;
            };
            let before = i
                .checked_sub(1)
                .map_or(t.dropped_mark, |p| t.seconds[p].generated);
            t.seconds[i].generated.saturating_sub(before)
        };
        let past = |n: usize| {
            (1..=n as u64)
                .rev()
                .filter_map(|back| current.checked_sub(back))
        };
        let mut history = History {
            seconds: HISTORY_SECONDS as u64,
            ..History::default()
        };
        for back in (1..=HISTORY_SECONDS as u64).rev() {
            // Before start: nothing.
            let sec = current.checked_sub(back).and_then(at);
            history.requests.push(sec.map_or(0, |x| x.requests));
            history
                .tokens
                .push(current.checked_sub(back).map_or(0, generated_in));
            history.refused.push(sec.map_or(0, |x| x.refused));
        }
        // Seconds there has been time for (a view taken in the first seconds averages over those).
        let span = (current as usize).clamp(1, RATE_SECONDS);
        let recent = |f: fn(&Second) -> u64| -> f64 {
            past(span).filter_map(at).map(f).sum::<u64>() as f64 / span as f64
        };
        let mut waits = [0u64; WAIT_BINS];
        for s in past(HISTORY_SECONDS).filter_map(at) {
            for (sum, n) in waits.iter_mut().zip(s.waits) {
                *sum += u64::from(n);
            }
        }
        let count: u64 = waits.iter().sum();
        let quantile = |q: f64| -> Option<f64> {
            let rank = ((count as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            waits.iter().enumerate().find_map(|(bin, n)| {
                seen += n;
                (seen >= rank).then(|| bin_seconds(bin))
            })
        };
        let rates = Rates {
            window_seconds: RATE_SECONDS as u64,
            queue_wait_window_seconds: HISTORY_SECONDS as u64,
            requests_per_second: recent(|s| s.requests),
            tokens_per_second: self.generated_rate(&t),
            refused_per_second: recent(|s| s.refused),
            queue_wait_p50_seconds: (count > 0).then(|| quantile(0.5)).flatten(),
            queue_wait_p95_seconds: (count > 0).then(|| quantile(0.95)).flatten(),
            queue_waits: count,
        };
        Snapshot {
            uptime,
            requests,
            outcomes,
            tokens: t.tokens,
            tenants,
            rates,
            history,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(outcome: Outcome, status: u16, tenant: &str, tokens: u64) -> Ended<'_> {
        Ended {
            outcome,
            status: Some(status),
            tenant: Some(tenant),
            tokens,
            completion_tokens: tokens,
            queue_wait: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_is_in_view_until_it_ends() {
        let live = Live::new();
        let id = http::HeaderValue::from_static("abc");
        let tracked = live.track(&id, &http::Method::POST, "/v1/chat/completions");
        tracked.set_tenant(&Arc::from("team-a"));
        tracked.set_prompt_tokens(12);
        tokio::time::sleep(Duration::from_millis(300)).await;
        tracked.admitted(2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        tracked.set_generated(5);
        tracked.set_phase(Phase::Answering);
        let snap = live.snapshot();
        let [r] = &snap.requests[..] else {
            panic!("{:?}", snap.requests)
        };
        assert_eq!(
            (r.request_id.as_str(), r.tenant.as_deref(), r.phase.as_str()),
            ("abc", Some("team-a"), Phase::Answering.label())
        );
        assert_eq!((r.prompt_tokens, r.generated_tokens, r.slots), (12, 5, 2));
        assert!((r.age_seconds - 0.5).abs() < 1e-3, "{r:?}");
        assert!((r.in_service_seconds.unwrap() - 0.2).abs() < 1e-3, "{r:?}");
        let key = tracked.request().key;
        assert_eq!(live.request(key).unwrap().request_id, "abc");
        tracked.end(ended(Outcome::Ok, 200, "team-a", 17));
        drop(tracked);
        let snap = live.snapshot();
        assert!(snap.requests.is_empty());
        assert_eq!(snap.tokens, 17);
        assert_eq!(snap.tenants[0].1.served_tokens, 17);
    }

    #[tokio::test(start_paused = true)]
    async fn rates_history_and_refusals_by_reason() {
        let live = Live::new();
        let id = http::HeaderValue::from_static("x");
        for second in 0..12u64 {
            for i in 0..4 {
                let t = live.track(&id, &http::Method::POST, "/v1/completions");
                if i == 3 {
                    t.end(ended(Outcome::QueueFull, 429, "b", 0));
                } else {
                    t.end(Ended {
                        // Three waits: 0, 10 ms and (in the last seconds) 2 s.
                        queue_wait: Some(Duration::from_millis([0, 10, 2000][i])),
                        ..ended(Outcome::Ok, 200, "a", 10 + second)
                    });
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let snap = live.snapshot();
        let r = &snap.rates;
        assert_eq!((r.requests_per_second, r.refused_per_second), (4.0, 1.0));
        // Seconds 2..=11 each served 3 * (10 + s) tokens, all at the second's start: measured from
        // a mark 10 s back, some of second 2 falls before it.
        let tokens: u64 = (2..12).map(|s| 3 * (10 + s)).sum();
        let low = tokens - 3 * 12;
        assert!(
            (low as f64 / 10.0..=tokens as f64 / 10.0).contains(&r.tokens_per_second),
            "{r:?}"
        );
        assert_eq!(r.queue_waits, 36);
        let p50 = r.queue_wait_p50_seconds.unwrap();
        assert!((0.009..0.012).contains(&p50), "{r:?}");
        let p95 = r.queue_wait_p95_seconds.unwrap();
        assert!((1.8..2.2).contains(&p95), "{r:?}");
        assert_eq!(snap.history.requests.len(), HISTORY_SECONDS);
        assert_eq!(snap.history.requests[HISTORY_SECONDS - 12..], [4; 12]);
        assert_eq!(snap.history.requests[..HISTORY_SECONDS - 12], [0; 48]);
        let b = &snap.tenants.iter().find(|t| t.0 == "b").unwrap().1;
        assert_eq!((b.requests, b.refused["queue_full"]), (12, 12));
        let a = &snap.tenants.iter().find(|t| t.0 == "a").unwrap().1;
        assert!(a.refused.is_empty());
        let queue_full = snap.outcomes.iter().find(|o| o.0 == "queue_full").unwrap();
        assert_eq!(queue_full.1, 12);
    }

    /// A long stream's tokens count in the rates as they stream, and once only when it ends.
    #[tokio::test(start_paused = true)]
    async fn streamed_tokens_count_at_once() {
        let live = Live::new();
        let id = http::HeaderValue::from_static("s");
        let t = live.track(&id, &http::Method::POST, "/v1/chat/completions");
        for n in 1..=4u64 {
            t.set_generated(n * 10);
            tokio::time::sleep(Duration::from_secs(1)).await;
            live.snapshot();
        }
        // Counted in the second they are seen (a look, or a request's end): the first 10 at 1 s.
        let snap = live.snapshot();
        assert_eq!(snap.history.tokens[HISTORY_SECONDS - 4..], [0, 10, 10, 10]);
        // The rate is measured from the start's mark to now: 40 in 4 s.
        assert_eq!(snap.rates.tokens_per_second, 10.0);
        t.end(Ended {
            completion_tokens: 45,
            ..ended(Outcome::Ok, 200, "a", 50)
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let snap = live.snapshot();
        // The last 10 streamed, and the 5 the usage reported beyond them.
        assert_eq!(snap.history.tokens[HISTORY_SECONDS - 1], 15);
    }

    #[test]
    fn wait_bins_hold_their_values_within_a_tenth() {
        for ms in [1.0, 3.0, 10.0, 250.0, 4_000.0, 60_000.0] {
            let got = bin_seconds(wait_bin(Duration::from_secs_f64(ms / 1e3))) * 1e3;
            assert!((got / ms - 1.0).abs() < 0.1, "{ms} ms -> {got} ms");
        }
        assert_eq!(bin_seconds(wait_bin(Duration::from_micros(300))), 0.0);
    }
}
