//! Streams always report usage. A chat stream whose client did not ask for
//! `stream_options.include_usage` is forwarded asking for it, so llama-server ends it with a usage
//! chunk (empty `choices`, `usage`, and the `timings` llama-server puts on its last chunk) that
//! slotgate reads like any other. The client must not see a chunk it did not ask for, so
//! [`StripUsage`] holds back the finishing chunk, moves the usage chunk's `timings` onto it, and drops
//! the usage chunk: the client gets exactly the stream it would have had.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use serde_json::Value;

use crate::respond::{Body, BodyError};

/// Endpoints whose streams end with a usage chunk when asked (llama-server's OpenAI chat streams).
pub const CHAT_PATHS: &[&str] = &["/v1/chat/completions", "/chat/completions"];
/// An event is never this long in a llama-server stream; past it the filter stands aside.
const MAX_EVENT: usize = 256 * 1024;

/// The client's stream, minus the usage chunk it did not ask for.
pub struct StripUsage {
    inner: Body,
    filter: Filter,
    /// Bytes due to the client before the end.
    tail: Option<Bytes>,
    done: bool,
}

impl StripUsage {
    pub fn new(inner: Body) -> Self {
        StripUsage {
            inner,
            filter: Filter::default(),
            tail: None,
            done: false,
        }
    }
}

impl HttpBody for StripUsage {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            if let Some(tail) = this.tail.take() {
                return Poll::Ready(Some(Ok(Frame::data(tail))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = this.filter.push(&data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    this.done = true;
                    let rest = this.filter.finish();
                    if !rest.is_empty() {
                        this.tail = Some(rest);
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.tail.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// SSE events in, the same events out, except that the usage chunk is folded into the finishing one.
#[derive(Default)]
struct Filter {
    buf: Vec<u8>,
    /// The finishing chunk (a `finish_reason`), held until we know whether a usage chunk follows.
    held: Option<Vec<u8>>,
    /// Gave up on an event too long to be llama-server's: everything passes unchanged.
    passthrough: bool,
}

impl Filter {
    fn push(&mut self, data: &[u8]) -> Bytes {
        if self.passthrough {
            return Bytes::copy_from_slice(data);
        }
        // The buffer holds no whole event, so the next end begins at its last byte at the earliest:
        // searching it all again for every chunk is quadratic in an event trickled in small chunks.
        let mut from = self.buf.len().saturating_sub(1);
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        while let Some(end) = find(&self.buf[from..], b"\n\n").map(|at| from + at) {
            let event: Vec<u8> = self.buf.drain(..end + 2).collect();
            self.event(event, &mut out);
            from = 0;
        }
        if self.buf.len() > MAX_EVENT {
            self.passthrough = true;
            out.extend(self.held.take().unwrap_or_default());
            out.append(&mut self.buf);
        }
        Bytes::from(out)
    }

    fn event(&mut self, event: Vec<u8>, out: &mut Vec<u8>) {
        if find(&event, b"\"choices\":[]").is_some() && find(&event, b"\"usage\"").is_some() {
            // The chunk the client did not ask for: its `timings` go onto the finishing chunk.
            if let Some(held) = self.held.take() {
                out.extend(with_timings_of(held, &event));
            }
            return;
        }
        out.extend(self.held.take().unwrap_or_default());
        if find(&event, b"\"finish_reason\":\"").is_some() {
            self.held = Some(event);
        } else {
            out.extend(event);
        }
    }

    fn finish(&mut self) -> Bytes {
        let mut out = self.held.take().unwrap_or_default();
        out.append(&mut self.buf);
        Bytes::from(out)
    }
}

/// `held` (one `data:` event) with the `timings` of `usage_event`, if it has any.
fn with_timings_of(held: Vec<u8>, usage_event: &[u8]) -> Vec<u8> {
    let json = |event: &[u8]| -> Option<Value> {
        let text = std::str::from_utf8(event).ok()?;
        serde_json::from_str(text.trim().strip_prefix("data:")?.trim()).ok()
    };
    let (Some(mut finishing), Some(usage)) = (json(&held), json(usage_event)) else {
        return held;
    };
    let Some(timings) = usage.get("timings") else {
        return held;
    };
    // llama-server's chunks are objects; any other JSON (an array holding a `finish_reason`) is
    // passed on as it came, where indexing it by key would panic.
    let Some(fields) = finishing.as_object_mut() else {
        return held;
    };
    fields.insert("timings".into(), timings.clone());
    format!("data: {finishing}\n\n").into_bytes()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLE: &str = r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"object":"chat.completion.chunk"}"#;
    const TOKEN: &str = r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hi"}}],"object":"chat.completion.chunk"}"#;
    const FINISH: &str = r#"data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"object":"chat.completion.chunk"}"#;
    const USAGE: &str = r#"data: {"choices":[],"object":"chat.completion.chunk","usage":{"completion_tokens":1,"prompt_tokens":9,"total_tokens":10},"timings":{"prompt_n":9,"cache_n":0,"predicted_n":1}}"#;

    fn stream(events: &[&str]) -> String {
        events.iter().map(|e| format!("{e}\n\n")).collect()
    }

    fn filtered(input: &str, piece: usize) -> String {
        let mut f = Filter::default();
        let mut out = Vec::new();
        for chunk in input.as_bytes().chunks(piece) {
            out.extend_from_slice(&f.push(chunk));
        }
        out.extend_from_slice(&f.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_usage_chunk_is_folded_into_the_finishing_chunk() {
        let input = stream(&[ROLE, TOKEN, FINISH, USAGE, "data: [DONE]"]);
        for piece in [input.len(), 7, 1] {
            let out = filtered(&input, piece);
            assert!(!out.contains("\"usage\""), "{out}");
            assert!(out.starts_with(&stream(&[ROLE, TOKEN])), "{out}");
            assert!(out.ends_with("data: [DONE]\n\n"), "{out}");
            let finishing = out
                .lines()
                .find(|l| l.contains("\"finish_reason\":\"length\""))
                .unwrap();
            let v: Value = serde_json::from_str(finishing.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(v["timings"]["predicted_n"], 1, "{out}");
            assert_eq!(v["choices"][0]["finish_reason"], "length");
        }
    }

    #[test]
    fn a_finishing_chunk_that_is_no_object_keeps_its_shape() {
        // Reproduced with the sse_usage fuzz target: the timings were set by indexing, which panics
        // on an array.
        let finishing = r#"data: [{"finish_reason":"stop"}]"#;
        let input = stream(&[finishing, USAGE, "data: [DONE]"]);
        assert_eq!(filtered(&input, 4), stream(&[finishing, "data: [DONE]"]));
    }

    #[test]
    fn a_stream_without_a_usage_chunk_passes_unchanged() {
        let input = stream(&[ROLE, TOKEN, FINISH, "data: [DONE]"]);
        assert_eq!(filtered(&input, 5), input);
        // Cut off after the finishing chunk: it is still delivered.
        let cut = stream(&[ROLE, TOKEN, FINISH]);
        assert_eq!(filtered(&cut, 3), cut);
    }
}
