//! Reads token usage out of a response as it streams past, in the answer's API dialect: OpenAI's
//! `usage` of a JSON body or an SSE chunk, llama-server's native `tokens_evaluated` /
//! `tokens_predicted`, Anthropic's `message_start` / `message_delta` usage, the Responses API's
//! `response.completed` usage, and failing them llama-server's `timings`.
//!
//! llama-server leaves `usage` out of a chat stream unless the client asked for
//! `stream_options.include_usage`; its last chunk then carries only `timings`. There `predicted_n` is
//! the tokens generated and `prompt_n` + `cache_n` the whole prompt (processed now plus reused from
//! the prompt cache), which is what its `usage.prompt_tokens` reports. Without this fallback such a
//! stream would be accounted as using nothing.

use serde_json::Value;

use crate::dialect::{DialectRef, Reported, Trust};

/// More than any usage-bearing JSON response we need to parse; beyond it the body is not buffered.
const MAX_JSON_BUFFER: usize = 4 << 20;
/// Longest SSE line kept while waiting for its end.
const MAX_SSE_LINE: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// The whole prompt, cached part included.
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Of `prompt_tokens`, those llama-server reused from its prompt cache (0 when it said none,
    /// or nothing).
    pub cached_tokens: u64,
}

impl Usage {
    /// The prompt's tokens llama-server processed now.
    pub fn uncached_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_sub(self.cached_tokens)
    }
}

/// Counts reported so far by one kind of source; each part is the latest that said it.
#[derive(Debug, Clone, Copy, Default)]
struct Partial {
    prompt: Option<u64>,
    completion: Option<u64>,
    cached: Option<u64>,
}

impl Partial {
    fn merge(&mut self, r: &Reported) {
        self.prompt = r.prompt.or(self.prompt);
        self.completion = r.completion.or(self.completion);
        self.cached = r.cached.or(self.cached);
    }

    fn usage(&self) -> Option<Usage> {
        (self.prompt.is_some() || self.completion.is_some()).then(|| {
            let prompt = self.prompt.unwrap_or(0);
            Usage {
                prompt_tokens: prompt,
                completion_tokens: self.completion.unwrap_or(0),
                cached_tokens: self.cached.unwrap_or(0).min(prompt),
            }
        })
    }
}

pub struct UsageScanner {
    dialect: DialectRef,
    sse: bool,
    buf: Vec<u8>,
    gave_up: bool,
    /// What `usage` (or the native counts) reported.
    reported: Partial,
    /// What `timings` said (cumulative in llama-server, so the last is the total).
    timings: Partial,
    /// Stream events that carried generated text: one token each in llama-server's streams.
    generated: u64,
    /// The stream's closing event went past: the answer is complete, whatever happens to the
    /// connection afterwards.
    done: bool,
}

impl std::fmt::Debug for UsageScanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageScanner")
            .field("dialect", &self.dialect.name())
            .field("sse", &self.sse)
            .field("generated", &self.generated)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl UsageScanner {
    /// `content_type` of the response decides between one JSON document and an event stream;
    /// `dialect` how either reports usage.
    pub fn new(content_type: Option<&str>, dialect: DialectRef) -> Self {
        let sse = super::is_event_stream(content_type);
        UsageScanner {
            dialect,
            sse,
            buf: Vec::new(),
            gave_up: false,
            reported: Partial::default(),
            timings: Partial::default(),
            generated: 0,
            done: false,
        }
    }

    fn record(&mut self, found: Option<Reported>) {
        match found {
            Some(r) if r.trust == Trust::Reported => self.reported.merge(&r),
            Some(r) => self.timings.merge(&r),
            None => {}
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        if self.gave_up {
            return;
        }
        // The buffer holds no whole line: only the new bytes can end one (searching it all again for
        // every chunk is quadratic in a line trickled in small chunks).
        let old_len = self.buf.len();
        self.buf.extend_from_slice(chunk);
        if !self.sse {
            if self.buf.len() > MAX_JSON_BUFFER {
                self.gave_up = true;
                self.buf = Vec::new();
            }
            return;
        }
        let (mut start, mut from) = (0, old_len);
        while let Some(nl) = self.buf[from..].iter().position(|&b| b == b'\n') {
            let line = &self.buf[start..from + nl];
            if let Some(data) = line.strip_prefix(b"data:") {
                if self.dialect.is_token_event(data) {
                    self.generated += 1;
                }
                if self.dialect.is_end_event(data) {
                    self.done = true;
                }
                let found = data_usage(self.dialect, data);
                self.record(found);
            }
            start = from + nl + 1;
            from = start;
        }
        self.buf.drain(..start);
        if self.buf.len() > MAX_SSE_LINE {
            self.buf.clear();
        }
    }

    /// Whether a stream's closing event has gone past.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Tokens of a stream so far, counted by its text-carrying events: what a client that left
    /// before the end was served.
    pub fn generated(&self) -> u64 {
        self.generated
    }

    /// The usage of a stream so far, or of the whole body (JSON). A reported `usage` anywhere in
    /// the response wins over `timings`.
    pub fn finish(&mut self) -> Option<Usage> {
        if !self.sse && !self.gave_up && !self.buf.is_empty() {
            let found = usage_doc(&self.buf).and_then(|v| self.dialect.usage(&v));
            self.record(found);
            self.buf = Vec::new();
        }
        if self.sse && !self.buf.is_empty() {
            if let Some(data) = self.buf.strip_prefix(b"data:") {
                let found = data_usage(self.dialect, data);
                self.record(found);
            }
            self.buf.clear();
        }
        // A report without the cached part takes it from `timings` when they say it.
        match self.reported.usage() {
            Some(mut u) => {
                if self.reported.cached.is_none() && self.timings.prompt == Some(u.prompt_tokens) {
                    u.cached_tokens = self.timings.cached.unwrap_or(0).min(u.prompt_tokens);
                }
                Some(u)
            }
            None => self.timings.usage(),
        }
    }
}

/// The usage an SSE `data:` line reports.
fn data_usage(dialect: DialectRef, data: &[u8]) -> Option<Reported> {
    // Cheap filter: most chunks carry one token and no usage (nor timings, unless the client asked
    // for `timings_per_token`).
    let has = |needle: &[u8]| data.windows(needle.len()).any(|w| w == needle);
    if !has(b"\"usage\"") && !has(b"\"tokens_predicted\"") && !has(b"\"timings\"") {
        return None;
    }
    usage_doc(data.trim_ascii()).and_then(|v| dialect.usage(&v))
}

/// The members of an answer (or of one streamed event) that can carry usage, parsed; the rest
/// (`choices`, `content`, `output`: the generated text) is skipped over unparsed, so reading the
/// usage of an answer costs no tree of its text. `None` when the document is not a JSON object.
fn usage_doc(bytes: &[u8]) -> Option<Value> {
    serde_json::from_slice::<UsageDoc>(bytes).ok().map(|d| d.0)
}

/// Top-level members a dialect's `usage` reads; `message` (Anthropic's `message_start`) and
/// `response` (the Responses API's `response.completed`) are read the same way, one level down.
const USAGE_MEMBERS: &[&str] = &[
    "usage",
    "tokens_predicted",
    "tokens_evaluated",
    "tokens_cached",
    "timings",
    "type",
];

struct UsageDoc(Value);

impl<'de> serde::Deserialize<'de> for UsageDoc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = UsageDoc;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<UsageDoc, A::Error> {
                let mut kept = serde_json::Map::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if USAGE_MEMBERS.contains(&key.as_ref()) {
                        let value = map.next_value::<Value>()?;
                        kept.insert(key.into_owned(), value);
                    } else if key == "message" || key == "response" {
                        let UsageDoc(inner) = map.next_value::<UsageDoc>()?;
                        kept.insert(key.into_owned(), inner);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(UsageDoc(Value::Object(kept)))
            }

            // Anything but an object (a `message` that is a string, say) holds no usage.
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<UsageDoc, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(UsageDoc(Value::Null))
            }

            fn visit_str<E>(self, _: &str) -> Result<UsageDoc, E> {
                Ok(UsageDoc(Value::Null))
            }

            fn visit_bool<E>(self, _: bool) -> Result<UsageDoc, E> {
                Ok(UsageDoc(Value::Null))
            }

            fn visit_i64<E>(self, _: i64) -> Result<UsageDoc, E> {
                Ok(UsageDoc(Value::Null))
            }

            fn visit_u64<E>(self, _: u64) -> Result<UsageDoc, E> {
                Ok(UsageDoc(Value::Null))
            }

            fn visit_f64<E>(self, _: f64) -> Result<UsageDoc, E> {
                Ok(UsageDoc(Value::Null))
            }

            fn visit_unit<E>(self) -> Result<UsageDoc, E> {
                Ok(UsageDoc(Value::Null))
            }
        }
        d.deserialize_any(Members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::{CHAT, COMPLETION, MESSAGES, RESPONSES};

    #[test]
    fn only_the_members_that_carry_usage_are_kept() {
        let doc = usage_doc(
            br#"{"choices":[{"message":{"content":"long text"}}],"message":"x","usage":{"prompt_tokens":3},"response":{"output":[1],"usage":{"input_tokens":2}},"timings":{"predicted_n":1}}"#,
        )
        .unwrap();
        assert_eq!(
            doc,
            serde_json::json!({"message": null, "usage": {"prompt_tokens": 3}, "response": {"usage": {"input_tokens": 2}}, "timings": {"predicted_n": 1}})
        );
        assert_eq!(usage_doc(b"[1,2]"), Some(Value::Null));
        assert_eq!(usage_doc(b"{\"usage\":"), None);
    }

    #[test]
    fn json_body_split_across_chunks() {
        let mut s = UsageScanner::new(Some("application/json; charset=utf-8"), CHAT);
        let body = br#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#;
        s.feed(&body[..20]);
        s.feed(&body[20..]);
        assert_eq!(
            s.finish(),
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 3,
                cached_tokens: 0,
            })
        );
    }

    #[test]
    fn sse_final_usage_chunk_and_native_completion() {
        let mut s = UsageScanner::new(Some("text/event-stream"), CHAT);
        s.feed(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"us",
        );
        s.feed(b"age\":{\"prompt_tokens\":5,\"completion_tokens\":9}}\n\ndata: [DONE]\n\n");
        assert_eq!(
            s.finish(),
            Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 9,
                cached_tokens: 0,
            })
        );

        let mut n = UsageScanner::new(Some("text/event-stream"), CHAT);
        n.feed(b"data: {\"content\":\"x\",\"stop\":true,\"tokens_predicted\":4,\"tokens_evaluated\":11}\n\n");
        assert_eq!(
            n.finish(),
            Some(Usage {
                prompt_tokens: 11,
                completion_tokens: 4,
                cached_tokens: 0,
            })
        );
    }

    fn usage(prompt_tokens: u64, completion_tokens: u64) -> Option<Usage> {
        cached(prompt_tokens, completion_tokens, 0)
    }

    fn cached(prompt_tokens: u64, completion_tokens: u64, cached_tokens: u64) -> Option<Usage> {
        Some(Usage {
            prompt_tokens,
            completion_tokens,
            cached_tokens,
        })
    }

    /// A chat stream as llama-server sends it when the client did not ask for
    #[test]
    fn text_carrying_events_are_counted_as_generated_tokens() {
        let mut s = UsageScanner::new(Some("text/event-stream"), CHAT);
        for piece in CHAT_STREAM_TIMINGS_ONLY.chunks(5) {
            s.feed(piece);
        }
        // The role chunk (content null) and the finishing chunk carry no text: one token streamed.
        assert_eq!(s.generated(), 1);
    }

    /// `stream_options.include_usage`: no `usage` anywhere, `timings` on the finishing chunk.
    const CHAT_STREAM_TIMINGS_ONLY: &[u8] = b"data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}],\"created\":1,\"id\":\"chatcmpl-x\",\"model\":\"m\",\"system_fingerprint\":\"b1\",\"object\":\"chat.completion.chunk\"}\n\n\
data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"created\":1,\"id\":\"chatcmpl-x\",\"model\":\"m\",\"system_fingerprint\":\"b1\",\"object\":\"chat.completion.chunk\"}\n\n\
data: {\"choices\":[{\"finish_reason\":\"length\",\"index\":0,\"delta\":{}}],\"created\":1,\"id\":\"chatcmpl-x\",\"model\":\"m\",\"system_fingerprint\":\"b1\",\"object\":\"chat.completion.chunk\",\"timings\":{\"cache_n\":9,\"prompt_n\":4,\"prompt_ms\":1.5,\"prompt_per_token_ms\":0.375,\"prompt_per_second\":2666.6,\"predicted_n\":7,\"predicted_ms\":20.1,\"predicted_per_token_ms\":2.87,\"predicted_per_second\":348.2}}\n\n\
data: [DONE]\n\n";

    #[test]
    fn stream_without_usage_is_counted_from_timings() {
        // Whole, and fed a few bytes at a time so the timings chunk is split mid-object.
        let mut s = UsageScanner::new(Some("text/event-stream"), CHAT);
        s.feed(CHAT_STREAM_TIMINGS_ONLY);
        assert_eq!(
            s.finish(),
            cached(9 + 4, 7, 9),
            "prompt = prompt_n + cache_n, cache_n of it cached"
        );
        let mut s = UsageScanner::new(Some("text/event-stream"), CHAT);
        for piece in CHAT_STREAM_TIMINGS_ONLY.chunks(7) {
            s.feed(piece);
        }
        assert_eq!(s.finish(), cached(13, 7, 9));

        // A last line without its newline is still read at the end.
        let mut s = UsageScanner::new(Some("text/event-stream"), CHAT);
        s.feed(
            b"data: {\"choices\":[],\"timings\":{\"cache_n\":0,\"prompt_n\":3,\"predicted_n\":2}}",
        );
        assert_eq!(s.finish(), usage(3, 2));

        // Older llama-server builds send no `cache_n`: `prompt_n` alone.
        let mut s = UsageScanner::new(Some("text/event-stream"), CHAT);
        s.feed(b"data: {\"content\":\"\",\"stop\":true,\"timings\":{\"prompt_n\":12,\"prompt_ms\":3.0,\"predicted_n\":5}}\n\n");
        assert_eq!(s.finish(), usage(12, 5));
    }

    #[test]
    fn timings_per_token_streams_count_the_last_timings() {
        // With `timings_per_token` every chunk carries the running totals.
        let mut s = UsageScanner::new(Some("text/event-stream"), CHAT);
        for n in 1..=4 {
            s.feed(format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t\"}}}}],\"timings\":{{\"cache_n\":2,\"prompt_n\":6,\"predicted_n\":{n}}}}}\n\n").as_bytes());
        }
        s.feed(b"data: [DONE]\n\n");
        assert_eq!(s.finish(), cached(8, 4, 2));
    }

    #[test]
    fn usage_wins_over_timings() {
        // In one chunk (`include_usage`: llama-server puts `timings` on the usage chunk).
        let mut s = UsageScanner::new(Some("text/event-stream"), CHAT);
        s.feed(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":7,\"prompt_tokens\":13,\"total_tokens\":20},\"timings\":{\"cache_n\":100,\"prompt_n\":100,\"predicted_n\":100}}\n\n");
        assert_eq!(s.finish(), usage(13, 7));

        // In different chunks, whichever comes last.
        for order in [[0, 1], [1, 0]] {
            let chunks: [&[u8]; 2] = [
                b"data: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"delta\":{}}],\"timings\":{\"cache_n\":50,\"prompt_n\":50,\"predicted_n\":50}}\n\n",
                b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":13,\"completion_tokens\":7}}\n\n",
            ];
            let mut s = UsageScanner::new(Some("text/event-stream"), CHAT);
            for i in order {
                s.feed(chunks[i]);
            }
            assert_eq!(s.finish(), usage(13, 7), "order {order:?}");
        }

        // The native counts win too.
        let mut s = UsageScanner::new(Some("text/event-stream"), CHAT);
        s.feed(b"data: {\"content\":\"\",\"stop\":true,\"tokens_predicted\":4,\"tokens_evaluated\":11,\"timings\":{\"cache_n\":1,\"prompt_n\":1,\"predicted_n\":1}}\n\n");
        assert_eq!(s.finish(), usage(11, 4));
    }

    #[test]
    fn the_cached_part_is_read_in_every_dialect() {
        // llama-server b11434's answers: chat's `prompt_tokens_details`, the native `tokens_cached`.
        let mut s = UsageScanner::new(Some("application/json"), CHAT);
        s.feed(br#"{"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":40,"total_tokens":43,"prompt_tokens_details":{"cached_tokens":32}}}"#);
        assert_eq!(s.finish(), cached(40, 3, 32));
        let mut s = UsageScanner::new(Some("text/event-stream"), COMPLETION);
        s.feed(b"data: {\"content\":\"\",\"stop\":true,\"tokens_predicted\":2,\"tokens_evaluated\":40,\"tokens_cached\":31}\n\n");
        assert_eq!(s.finish(), cached(40, 2, 31));
        // Usage without its cached part, and timings of another prompt: nothing taken from them.
        let mut s = UsageScanner::new(Some("application/json"), CHAT);
        s.feed(br#"{"choices":[],"usage":{"prompt_tokens":13,"completion_tokens":7},"timings":{"cache_n":100,"prompt_n":100,"predicted_n":7}}"#);
        assert_eq!(s.finish(), cached(13, 7, 0));
    }

    #[test]
    fn whole_json_bodies_fall_back_to_timings() {
        let mut s = UsageScanner::new(Some("application/json; charset=utf-8"), CHAT);
        s.feed(br#"{"choices":[{"index":0,"message":{"content":"x"}}],"timings":{"cache_n":20,"prompt_n":5,"predicted_n":8}}"#);
        assert_eq!(s.finish(), cached(25, 8, 20));

        let mut s = UsageScanner::new(Some("application/json"), CHAT);
        s.feed(br#"{"choices":[],"usage":{"prompt_tokens":25,"completion_tokens":8},"timings":{"cache_n":0,"prompt_n":1,"predicted_n":1}}"#);
        assert_eq!(s.finish(), usage(25, 8));

        // A `timings` without any count is no usage.
        let mut s = UsageScanner::new(Some("application/json"), CHAT);
        s.feed(br#"{"content":"x","timings":{"prompt_ms":1.0}}"#);
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn no_usage_is_none() {
        let mut s = UsageScanner::new(Some("application/json"), CHAT);
        s.feed(b"{\"tokens\":[1,2,3]}");
        assert_eq!(s.finish(), None);

        let mut s = UsageScanner::new(Some("text/event-stream"), CHAT);
        s.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"timings\"}}]}\n\ndata: [DONE]\n\n");
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn native_streams_end_at_stop_and_anthropic_and_responses_streams_report_usage() {
        let mut s = UsageScanner::new(Some("text/event-stream"), COMPLETION);
        s.feed(b"data: {\"content\":\"a\",\"stop\":false}\n\n");
        assert!(!s.done());
        s.feed(b"data: {\"content\":\"\",\"stop\":true,\"tokens_predicted\":1,\"tokens_evaluated\":4}\n\n");
        assert!(s.done());
        assert_eq!(s.finish(), usage(4, 1));

        let anthropic = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"cache_read_input_tokens\":28,\"input_tokens\":1,\"output_tokens\":0}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" a\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" b\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":2}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let mut s = UsageScanner::new(Some("text/event-stream"), MESSAGES);
        for piece in anthropic.chunks(9) {
            s.feed(piece);
        }
        assert_eq!((s.generated(), s.done()), (2, true));
        assert_eq!(s.finish(), cached(29, 2, 28));

        let responses = b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":29,\"output_tokens\":1}},\"timings\":{\"cache_n\":28,\"prompt_n\":1,\"predicted_n\":1}}\n\n";
        let mut s = UsageScanner::new(Some("text/event-stream"), RESPONSES);
        s.feed(responses);
        assert_eq!((s.generated(), s.done()), (1, true));
        assert_eq!(s.finish(), cached(29, 1, 28));
    }
}
