//! Entry points for the fuzz targets and their corpus replay: each takes arbitrary bytes, runs the
//! code slotgate runs on untrusted input (request bodies, upstream streams, policy output, config)
//! and panics when an invariant breaks. `fuzz/` drives them under libFuzzer; `slotgate-tests`
//! replays the committed corpus under `cargo test`. See `docs/fuzzing.md`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use serde_json::Value;
use slotgate_sdk::{Decision, Mutations, RequestSummary, Verdict};

use crate::admission::Claim;
use crate::config::{
    AdminAddr, ByteSize, Config, Dur, KvPool, ListenAddr, LogFormat, Settings, SocketMode,
    Tokenizer, UpstreamAddr,
};
use crate::dialect::usage::UsageScanner;
use crate::error::GateError;
use crate::pipeline::intake::Intake;
use crate::pipeline::routes::{self, Handling};
use crate::pipeline::strip::StripUsage;
use crate::policy::fold::{self as chain, ChainOutcome, Mode, OnError, Step};
use crate::policy::sandbox::MIN_WEIGHT;
use crate::policy::v1::json::{parse_decision, settings_verdict};
use crate::policy::{EvalError, LoadError};
use crate::respond::BodyError;

mod access_line;
pub use access_line::access_line;

/// Endpoints the `summary` target picks from (its first byte): slot routes of several dialects and
/// passthroughs, POST and GET.
const SUMMARY_ROUTES: [(&str, &str); 8] = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/completions"),
    ("POST", "/completion"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/responses"),
    ("POST", "/tokenize"),
    ("GET", "/v1/models"),
];

/// Caps the `summary` target applies as a policy's `cap_max_tokens` (bits 5-6 of its first byte).
const CAPS: [Option<u64>; 4] = [None, Some(0), Some(16), Some(u64::MAX)];

/// A request body as intake reads it, then the policy mutations and the usage request of the
/// pipeline. Byte 0 picks the endpoint (bits 0-2), `disable_prompt_cache` (bit 3), `strip_id_slot`
/// (bit 4) and a cap (bits 5-6); the rest is the body.
pub fn summary(data: &[u8]) {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let (method, path) = SUMMARY_ROUTES[usize::from(sel & 7)];
    let method: Method = method.parse().unwrap();
    let handling = routes::find(&method, path).expect("a route llama-server serves");
    let slot = matches!(handling, Handling::Slot(_));
    let (parts, ()) = Request::builder()
        .method(method.clone())
        .uri(path)
        .body(())
        .unwrap()
        .into_parts();

    let mut intake = match Intake::new(parts, Bytes::copy_from_slice(body), handling, None) {
        Ok(i) => i,
        Err(e) => {
            // Only a slot route reads its body; anything else is forwarded as it came.
            assert!(slot, "{path}: {e:?}");
            assert!(matches!(e, GateError::InvalidJson(_)), "{e:?}");
            assert_eq!(e.status(), 400);
            return;
        }
    };
    let summary = intake.summary.clone();
    assert_eq!(summary.path, path);
    assert_eq!(
        summary.prompt_tokens_estimate,
        intake
            .ask
            .prompts
            .iter()
            .map(|c| c.div_ceil(4))
            .sum::<u64>()
    );
    assert!(
        summary.prompt_tokens_estimate
            <= summary.prompt_chars.div_ceil(4) + intake.ask.prompts.len() as u64
    );
    // Every counted character is at least one byte of the body.
    assert!(summary.prompt_chars <= body.len() as u64, "{summary:?}");
    match (&intake.json, slot) {
        (None, true) => panic!("a slot route's body is parsed"),
        (None, false) => {
            assert_eq!((summary.prompt_chars, summary.stream), (0, false));
        }
        (Some(j), _) => {
            assert!(j.is_object());
            assert_eq!(summary.model.as_deref(), j["model"].as_str());
        }
    }

    let mutations = Mutations {
        cap_max_tokens: CAPS[usize::from((sel >> 5) & 3)],
        disable_prompt_cache: sel & 8 != 0,
        strip_id_slot: sel & 16 != 0,
        ..Mutations::default()
    };
    let before = intake.summary.clone();
    intake
        .apply(&mutations)
        .expect("a body that parsed once parses again");
    if let (Some(cap), true) = (mutations.cap_max_tokens, slot) {
        let n = intake.summary.max_tokens.expect("a cap is a bound");
        assert!(n <= cap, "{n} over the cap {cap}");
    }
    if slot {
        let asked = intake.ask_for_stream_usage().unwrap();
        if asked {
            assert!(before.stream);
            assert_eq!(
                intake.json.as_ref().unwrap()["stream_options"]["include_usage"],
                true
            );
        }
    }
    // Whatever was rewritten, the body forwarded is the JSON slotgate holds (each edit made in the
    // client's bytes), and the summary a policy saw still describes it.
    let Some(held) = &intake.json else {
        assert_eq!(&intake.body[..], body);
        return;
    };
    if !slot {
        assert_eq!(&intake.body[..], body, "a passthrough is never changed");
        return;
    }
    let sent: Value = serde_json::from_slice(&intake.body).expect("forwarded body is JSON");
    assert_eq!(
        &sent, held,
        "the bytes forwarded and the body slotgate reads agree"
    );
    if mutations.disable_prompt_cache {
        assert_eq!(sent["cache_prompt"], false);
    }
    if mutations.strip_id_slot {
        assert!(sent.get("id_slot").is_none());
    }
    let (parts, ()) = Request::builder()
        .method(method)
        .uri(path)
        .body(())
        .unwrap()
        .into_parts();
    let again = Intake::new(parts, intake.body.clone(), handling, None)
        .expect("the forwarded body reads back");
    let s = &again.summary;
    assert_eq!(
        (s.prompt_chars, &s.model, s.stream, s.priority_hint),
        (
            before.prompt_chars,
            &before.model,
            before.stream,
            before.priority_hint
        )
    );
    assert_eq!(s.max_tokens, intake.summary.max_tokens, "{s:?}");
}

/// One `Content-Type` per value of the low two bits of byte 0.
const CONTENT_TYPES: [Option<&str>; 4] = [
    Some("text/event-stream"),
    Some("text/event-stream; charset=utf-8"),
    Some("application/json; charset=utf-8"),
    None,
];

/// The APIs whose answers the `sse_usage` target reads (bits 2-3 of byte 0): each reports usage in
/// its own way.
const SCAN_DIALECTS: [crate::dialect::DialectRef; 4] = [
    crate::dialect::CHAT,
    crate::dialect::MESSAGES,
    crate::dialect::RESPONSES,
    crate::dialect::COMPLETION,
];

/// Below this no event can outgrow the stream filter's buffer (256 KiB), so where the stream is cut
/// into chunks cannot matter; a longer event makes the filter stand aside, depending on the cuts.
const FILTER_SPLIT_INVARIANT_BELOW: usize = 256 * 1024;
/// Likewise for the usage scanner's longest kept line (1 MiB).
const SCANNER_SPLIT_INVARIANT_BELOW: usize = 1 << 20;

/// An upstream response as the usage filter (`StripUsage`) and the usage scanner see it. Byte 0
/// picks the content type (bits 0-1); byte 1 seeds where the rest is cut into chunks. Both must
/// give the same result whether the bytes arrive whole, cut there, or one at a time.
pub fn sse_usage(data: &[u8]) {
    let [sel, seed, stream @ ..] = data else {
        return;
    };
    let content_type = CONTENT_TYPES[usize::from(sel & 3)];
    let dialect = SCAN_DIALECTS[usize::from((sel >> 2) & 3)];
    let cuts = [
        vec![stream],
        cut(stream, *seed),
        stream.chunks(1).collect::<Vec<_>>(),
    ];

    let filtered: Vec<Vec<u8>> = cuts.iter().map(|c| strip_usage(c)).collect();
    let out = &filtered[0];
    if stream.len() < FILTER_SPLIT_INVARIANT_BELOW {
        assert_eq!(filtered[1], *out, "cut at seed {seed}");
        assert_eq!(filtered[2], *out, "cut into single bytes");
    }
    if !contains(stream, b"\"choices\":[]") || !contains(stream, b"\"usage\"") {
        // Nothing that looks like a usage chunk: the client's stream is passed on untouched.
        assert_eq!(out, stream);
    }
    // Only a finishing chunk that takes on a usage chunk's `timings` is rewritten (the usage chunk
    // itself is dropped), and re-serialising JSON only grows numbers (`1e15` becomes
    // `1000000000000000.0`): the output is bounded by a small multiple of the input.
    assert!(
        out.len() <= 8 * stream.len() + 8,
        "{} bytes out of {}",
        out.len(),
        stream.len()
    );

    let scanned: Vec<_> = cuts
        .iter()
        .map(|c| scan(content_type, dialect, c))
        .collect();
    if stream.len() < SCANNER_SPLIT_INVARIANT_BELOW {
        assert_eq!(scanned[1], scanned[0], "cut at seed {seed}");
        assert_eq!(scanned[2], scanned[0], "cut into single bytes");
    }
    // Each text-carrying event is one line, ended by its newline.
    let lines = stream.iter().filter(|&&b| b == b'\n').count() as u64;
    assert!(scanned[0].1 <= lines);
}

/// `stream` cut at points drawn from `seed` (a small xorshift, so a seed names a cutting).
fn cut(stream: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut state = u32::from(seed).wrapping_mul(0x9E37_79B9) | 1;
    let mut rest = stream;
    let mut chunks = Vec::new();
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        // Mostly short chunks, now and then an empty one or a long one.
        let len = match state % 8 {
            0 => 0,
            7 => (state >> 8) as usize % 512,
            n => n as usize,
        }
        .min(rest.len());
        let (head, tail) = rest.split_at(len);
        chunks.push(head);
        rest = tail;
    }
    chunks
}

/// The client's stream out of `StripUsage` when the upstream sends `chunks`.
fn strip_usage(chunks: &[&[u8]]) -> Vec<u8> {
    let upstream = Frames(chunks.iter().map(|c| Bytes::copy_from_slice(c)).collect());
    let mut body = StripUsage::new(upstream.boxed_unsync());
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    loop {
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let data = frame.into_data().expect("only data frames were sent");
                out.extend_from_slice(&data);
            }
            Poll::Ready(Some(Err(e))) => panic!("an upstream without errors failed: {e}"),
            Poll::Ready(None) => break,
            Poll::Pending => panic!("an upstream that is always ready is pending"),
        }
    }
    assert!(body.is_end_stream());
    out
}

/// The usage and the generated-token count the scanner reads from `chunks`.
fn scan(
    content_type: Option<&str>,
    dialect: crate::dialect::DialectRef,
    chunks: &[&[u8]],
) -> (Option<crate::dialect::usage::Usage>, u64) {
    let mut scanner = UsageScanner::new(content_type, dialect);
    for chunk in chunks {
        scanner.feed(chunk);
    }
    let generated = scanner.generated();
    (scanner.finish(), generated)
}

/// An upstream body whose data frames are always ready.
struct Frames(VecDeque<Bytes>);

impl HttpBody for Frames {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A policy's output: as an `evaluate` decision (checked, folded into a chain, turned into the
/// response or the scheduler claim it leads to) and as a `validate_settings` answer.
pub fn policy_output(data: &[u8]) {
    // `None` also when the bytes are no JSON value: serde_json skips an unknown field without
    // checking its strings are UTF-8, so the typed parse accepts a little more than `Value`'s.
    let valid = json_field(data, "valid");
    match settings_verdict(data) {
        Ok(_) => assert!(matches!(valid, None | Some(Value::Bool(true))), "{valid:?}"),
        Err(LoadError::Settings(_)) => {
            assert!(
                matches!(valid, None | Some(Value::Bool(false))),
                "{valid:?}"
            )
        }
        Err(LoadError::Eval(EvalError::InvalidOutput(_))) => {}
        Err(e) => panic!("validate_settings output gave {e:?}"),
    }

    let decision = match parse_decision(data) {
        Ok(d) => d,
        Err(e) => {
            assert_eq!(e.kind(), "invalid_output", "{e:?}");
            return;
        }
    };
    if decision.verdict == Verdict::Deny {
        assert!(matches!(decision.status, None | Some(403) | Some(429)));
    }
    if let Some(w) = decision.weight {
        assert!(w.is_finite() && w >= MIN_WEIGHT, "{w}");
    }
    // What the host accepted survives the trip through JSON, as it would in an access log or in
    // `on_complete`'s copy of the decision.
    let text = serde_json::to_vec(&decision).unwrap();
    let again = parse_decision(&text).expect("an accepted decision, re-serialised, is accepted");
    assert_eq!(
        Decision {
            weight: None,
            ..again.clone()
        },
        Decision {
            weight: None,
            ..decision.clone()
        }
    );
    assert_eq!(again.weight.is_some(), decision.weight.is_some());

    let step = |d: &Decision| Step {
        policy: "fuzz",
        mode: Mode::Enforce,
        on_error: OnError::Deny,
        result: Ok(d.clone()),
    };
    let outcome = chain::fold([step(&decision)]);
    // A chain of the same policy twice decides the same: every combination rule is idempotent.
    assert_eq!(chain::fold([step(&decision), step(&decision)]), outcome);
    match outcome {
        ChainOutcome::Deny { policy, decision } => {
            let status = decision.status.unwrap_or(403);
            let e = GateError::PolicyDenied {
                status,
                message: decision.message.clone().unwrap_or_default(),
                retry_after: decision.retry_after_seconds,
                policy,
                detail: Box::default(),
            };
            let resp = crate::respond::error(&e, None);
            assert_eq!(resp.status().as_u16(), status);
            let retry_after = resp
                .headers()
                .get(http::header::RETRY_AFTER)
                .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
            assert_eq!(retry_after, decision.retry_after_seconds.map(|s| s.max(1)));
        }
        ChainOutcome::Allow(combined) => {
            assert_eq!(
                (
                    combined.cost,
                    combined.priority,
                    &combined.tenant,
                    &combined.mutations
                ),
                (
                    decision.cost,
                    decision.priority,
                    &decision.tenant,
                    &decision.mutations
                )
            );
            let request = RequestSummary {
                prompt_chars: 40,
                prompt_tokens_estimate: 10,
                max_tokens: Some(64),
                ..RequestSummary::default()
            };
            let claim = Claim::new(
                &request,
                Some(&combined),
                combined.priority.unwrap_or(0),
                crate::admission::estimated_cost(&request),
            );
            assert!(claim.weight.is_finite() && claim.weight > 0.0);
            // Finite, and far enough from overflow that the fair-share counters can add up
            // many of them.
            let charge = claim.charge();
            assert!(
                (0.0..=u64::MAX as f64 / MIN_WEIGHT).contains(&charge),
                "cost {} / weight {} = {charge}",
                claim.cost,
                claim.weight
            );
        }
        ChainOutcome::Failed { .. } => unreachable!("the step succeeded"),
    }
}

/// `key` of `data` when it is a JSON object.
fn json_field(data: &[u8], key: &str) -> Option<Value> {
    serde_json::from_slice::<Value>(data)
        .ok()?
        .get(key)
        .cloned()
}

/// A config file: `Settings` from TOML, validated into a `Config` whose effective settings print
/// and read back to the same; and every line through the value parsers, each of which must read
/// back what it displays.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(settings) = toml::from_str::<Settings>(text) {
        if let Ok(cfg) = Config::from_settings(settings) {
            check_config(&cfg);
        }
    }
    for value in std::iter::once(text).chain(text.lines()) {
        round_trip::<Dur>(value);
        round_trip::<ByteSize>(value);
        round_trip::<SocketMode>(value);
        round_trip::<ListenAddr>(value);
        round_trip::<AdminAddr>(value);
        round_trip::<Tokenizer>(value);
        round_trip::<LogFormat>(value);
        round_trip::<KvPool>(value);
        if let Some(UpstreamAddr::Tcp(authority)) = round_trip::<UpstreamAddr>(value) {
            // The upstream client builds every request's URI from the address: it must be a URI
            // whose authority is the address, with the port as given.
            let uri: Uri = format!("http://{authority}/")
                .parse()
                .unwrap_or_else(|e| panic!("accepted upstream {value:?} is no URI: {e}"));
            let port = authority
                .rsplit_once(':')
                .unwrap()
                .1
                .parse::<u16>()
                .unwrap();
            assert_eq!(uri.authority().unwrap().as_str(), authority);
            assert_eq!(uri.port_u16(), Some(port), "accepted upstream {value:?}");
        }
    }
}

/// An accepted config as `slotgate check` prints it, and what reading that back gives.
fn check_config(cfg: &Config) {
    let text = toml::to_string(&cfg.effective()).expect("effective settings print as TOML");
    let settings: Settings = toml::from_str(&text).expect("printed settings read back");
    let again = Config::from_settings(settings).expect("printed settings validate");
    let text_again = toml::to_string(&again.effective()).unwrap();
    assert_eq!(text_again, text);
    if let Some(limit) = cfg.tenant_queue_limit() {
        assert!((1..=cfg.queue_depth).contains(&limit), "{limit}");
    }
}

/// `value` parsed as `T` and, when it parses, displayed and parsed again to the same.
fn round_trip<T>(value: &str) -> Option<T>
where
    T: std::str::FromStr + std::fmt::Display + PartialEq + std::fmt::Debug,
{
    let parsed = value.parse::<T>().ok()?;
    let shown = parsed.to_string();
    let again = shown.parse::<T>().ok();
    assert_eq!(
        again.as_ref(),
        Some(&parsed),
        "{value:?} shown as {shown:?}"
    );
    Some(parsed)
}
