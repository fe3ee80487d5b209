//! Reads token usage out of a response as it streams past: `usage` of an OpenAI-shaped JSON body or of
//! an SSE chunk, or llama-server's native `tokens_evaluated` / `tokens_predicted`, and failing both
//! llama-server's `timings`.
//!
//! llama-server leaves `usage` out of a stream unless the client asked for
//! `stream_options.include_usage`; its last chunk then carries only `timings`. There `predicted_n` is
//! the tokens generated and `prompt_n` + `cache_n` the whole prompt (processed now plus reused from
//! the prompt cache), which is what its `usage.prompt_tokens` reports. Without this fallback such a
//! stream would be accounted as using nothing.

use serde_json::Value;

/// More than any usage-bearing JSON response we need to parse; beyond it the body is not buffered.
const MAX_JSON_BUFFER: usize = 4 << 20;
/// Longest SSE line kept while waiting for its end.
const MAX_SSE_LINE: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// How much a source of usage is trusted: a reported `usage` (or native count) beats `timings`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Timings,
    Reported,
}

#[derive(Debug)]
pub struct UsageScanner {
    sse: bool,
    buf: Vec<u8>,
    gave_up: bool,
    /// The last usage reported by `usage` or the native counts.
    reported: Option<Usage>,
    /// The last usage derived from `timings` (cumulative in llama-server, so the last is the total).
    timings: Option<Usage>,
    /// Stream events that carried generated text: one token each in llama-server's streams.
    generated: u64,
    /// The stream's `data: [DONE]` went past: the answer is complete, whatever happens to the
    /// connection afterwards.
    done: bool,
}

impl UsageScanner {
    /// `content_type` of the response decides between one JSON document and an event stream.
    pub fn new(content_type: Option<&str>) -> Self {
        let sse = content_type.is_some_and(|ct| ct.starts_with("text/event-stream"));
        UsageScanner {
            sse,
            buf: Vec::new(),
            gave_up: false,
            reported: None,
            timings: None,
            generated: 0,
            done: false,
        }
    }

    fn record(&mut self, found: Option<(Source, Usage)>) {
        match found {
            Some((Source::Reported, u)) => self.reported = Some(u),
            Some((Source::Timings, u)) => self.timings = Some(u),
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
            if line.starts_with(b"data:") && contains(line, b"\"content\":\"") {
                self.generated += 1;
            }
            if line.strip_prefix(b"data:").map(<[u8]>::trim_ascii) == Some(b"[DONE]") {
                self.done = true;
            }
            let found = sse_line_usage(line);
            self.record(found);
            start = from + nl + 1;
            from = start;
        }
        self.buf.drain(..start);
        if self.buf.len() > MAX_SSE_LINE {
            self.buf.clear();
        }
    }

    /// Whether an OpenAI stream's closing `data: [DONE]` has gone past.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Tokens of a stream so far, counted by its text-carrying events: what a client that left
    /// before the end was served.
    pub fn generated(&self) -> u64 {
        self.generated
    }

    /// The last usage seen (streams), or the usage of the whole body (JSON). A reported `usage`
    /// anywhere in the response wins over `timings`.
    pub fn finish(&mut self) -> Option<Usage> {
        if !self.sse && !self.gave_up && !self.buf.is_empty() {
            let found = serde_json::from_slice::<Value>(&self.buf)
                .ok()
                .as_ref()
                .and_then(extract);
            self.record(found);
            self.buf = Vec::new();
        }
        if self.sse && !self.buf.is_empty() {
            let found = sse_line_usage(&self.buf);
            self.record(found);
            self.buf.clear();
        }
        self.reported.or(self.timings)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn sse_line_usage(line: &[u8]) -> Option<(Source, Usage)> {
    let data = line.strip_prefix(b"data:")?;
    // Cheap filter: most chunks carry one token and no usage (nor timings, unless the client asked
    // for `timings_per_token`).
    let has = |needle: &[u8]| data.windows(needle.len()).any(|w| w == needle);
    if !has(b"\"usage\"") && !has(b"\"tokens_predicted\"") && !has(b"\"timings\"") {
        return None;
    }
    serde_json::from_slice::<Value>(data.trim_ascii())
        .ok()
        .as_ref()
        .and_then(extract)
}

/// The usage one JSON document reports, in order of trust: `usage`, the native
/// `tokens_evaluated` / `tokens_predicted`, then `timings`.
fn extract(v: &Value) -> Option<(Source, Usage)> {
    let count = |o: &Value, key: &str| o.get(key).and_then(Value::as_u64);
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        let usage = Usage {
            prompt_tokens: count(u, "prompt_tokens").unwrap_or(0),
            completion_tokens: count(u, "completion_tokens").unwrap_or(0),
        };
        return Some((Source::Reported, usage));
    }
    let predicted = count(v, "tokens_predicted");
    let evaluated = count(v, "tokens_evaluated");
    if predicted.is_some() || evaluated.is_some() {
        let usage = Usage {
            prompt_tokens: evaluated.unwrap_or(0),
            completion_tokens: predicted.unwrap_or(0),
        };
        return Some((Source::Reported, usage));
    }
    // llama-server's `timings`: `prompt_n` prompt tokens processed for this request, `cache_n` reused
    // from the slot's cache (older builds send no `cache_n`), `predicted_n` tokens generated.
    let t = v.get("timings").filter(|t| t.is_object())?;
    let (processed, cached, predicted) = (
        count(t, "prompt_n"),
        count(t, "cache_n"),
        count(t, "predicted_n"),
    );
    if processed.is_none() && cached.is_none() && predicted.is_none() {
        return None;
    }
    let usage = Usage {
        prompt_tokens: processed.unwrap_or(0).saturating_add(cached.unwrap_or(0)),
        completion_tokens: predicted.unwrap_or(0),
    };
    Some((Source::Timings, usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_body_split_across_chunks() {
        let mut s = UsageScanner::new(Some("application/json; charset=utf-8"));
        let body = br#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#;
        s.feed(&body[..20]);
        s.feed(&body[20..]);
        assert_eq!(
            s.finish(),
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 3
            })
        );
    }

    #[test]
    fn sse_final_usage_chunk_and_native_completion() {
        let mut s = UsageScanner::new(Some("text/event-stream"));
        s.feed(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"us",
        );
        s.feed(b"age\":{\"prompt_tokens\":5,\"completion_tokens\":9}}\n\ndata: [DONE]\n\n");
        assert_eq!(
            s.finish(),
            Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 9
            })
        );

        let mut n = UsageScanner::new(Some("text/event-stream"));
        n.feed(b"data: {\"content\":\"x\",\"stop\":true,\"tokens_predicted\":4,\"tokens_evaluated\":11}\n\n");
        assert_eq!(
            n.finish(),
            Some(Usage {
                prompt_tokens: 11,
                completion_tokens: 4
            })
        );
    }

    fn usage(prompt_tokens: u64, completion_tokens: u64) -> Option<Usage> {
        Some(Usage {
            prompt_tokens,
            completion_tokens,
        })
    }

    /// A chat stream as llama-server sends it when the client did not ask for
    #[test]
    fn text_carrying_events_are_counted_as_generated_tokens() {
        let mut s = UsageScanner::new(Some("text/event-stream"));
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
        let mut s = UsageScanner::new(Some("text/event-stream"));
        s.feed(CHAT_STREAM_TIMINGS_ONLY);
        assert_eq!(s.finish(), usage(9 + 4, 7), "prompt = prompt_n + cache_n");
        let mut s = UsageScanner::new(Some("text/event-stream"));
        for piece in CHAT_STREAM_TIMINGS_ONLY.chunks(7) {
            s.feed(piece);
        }
        assert_eq!(s.finish(), usage(13, 7));

        // A last line without its newline is still read at the end.
        let mut s = UsageScanner::new(Some("text/event-stream"));
        s.feed(
            b"data: {\"choices\":[],\"timings\":{\"cache_n\":0,\"prompt_n\":3,\"predicted_n\":2}}",
        );
        assert_eq!(s.finish(), usage(3, 2));

        // Older llama-server builds send no `cache_n`: `prompt_n` alone.
        let mut s = UsageScanner::new(Some("text/event-stream"));
        s.feed(b"data: {\"content\":\"\",\"stop\":true,\"timings\":{\"prompt_n\":12,\"prompt_ms\":3.0,\"predicted_n\":5}}\n\n");
        assert_eq!(s.finish(), usage(12, 5));
    }

    #[test]
    fn timings_per_token_streams_count_the_last_timings() {
        // With `timings_per_token` every chunk carries the running totals.
        let mut s = UsageScanner::new(Some("text/event-stream"));
        for n in 1..=4 {
            s.feed(format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t\"}}}}],\"timings\":{{\"cache_n\":2,\"prompt_n\":6,\"predicted_n\":{n}}}}}\n\n").as_bytes());
        }
        s.feed(b"data: [DONE]\n\n");
        assert_eq!(s.finish(), usage(8, 4));
    }

    #[test]
    fn usage_wins_over_timings() {
        // In one chunk (`include_usage`: llama-server puts `timings` on the usage chunk).
        let mut s = UsageScanner::new(Some("text/event-stream"));
        s.feed(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":7,\"prompt_tokens\":13,\"total_tokens\":20},\"timings\":{\"cache_n\":100,\"prompt_n\":100,\"predicted_n\":100}}\n\n");
        assert_eq!(s.finish(), usage(13, 7));

        // In different chunks, whichever comes last.
        for order in [[0, 1], [1, 0]] {
            let chunks: [&[u8]; 2] = [
                b"data: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"delta\":{}}],\"timings\":{\"cache_n\":50,\"prompt_n\":50,\"predicted_n\":50}}\n\n",
                b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":13,\"completion_tokens\":7}}\n\n",
            ];
            let mut s = UsageScanner::new(Some("text/event-stream"));
            for i in order {
                s.feed(chunks[i]);
            }
            assert_eq!(s.finish(), usage(13, 7), "order {order:?}");
        }

        // The native counts win too.
        let mut s = UsageScanner::new(Some("text/event-stream"));
        s.feed(b"data: {\"content\":\"\",\"stop\":true,\"tokens_predicted\":4,\"tokens_evaluated\":11,\"timings\":{\"cache_n\":1,\"prompt_n\":1,\"predicted_n\":1}}\n\n");
        assert_eq!(s.finish(), usage(11, 4));
    }

    #[test]
    fn whole_json_bodies_fall_back_to_timings() {
        let mut s = UsageScanner::new(Some("application/json; charset=utf-8"));
        s.feed(br#"{"choices":[{"index":0,"message":{"content":"x"}}],"timings":{"cache_n":20,"prompt_n":5,"predicted_n":8}}"#);
        assert_eq!(s.finish(), usage(25, 8));

        let mut s = UsageScanner::new(Some("application/json"));
        s.feed(br#"{"choices":[],"usage":{"prompt_tokens":25,"completion_tokens":8},"timings":{"cache_n":0,"prompt_n":1,"predicted_n":1}}"#);
        assert_eq!(s.finish(), usage(25, 8));

        // A `timings` without any count is no usage.
        let mut s = UsageScanner::new(Some("application/json"));
        s.feed(br#"{"content":"x","timings":{"prompt_ms":1.0}}"#);
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn no_usage_is_none() {
        let mut s = UsageScanner::new(Some("application/json"));
        s.feed(b"{\"tokens\":[1,2,3]}");
        assert_eq!(s.finish(), None);

        let mut s = UsageScanner::new(Some("text/event-stream"));
        s.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"timings\"}}]}\n\ndata: [DONE]\n\n");
        assert_eq!(s.finish(), None);
    }
}
