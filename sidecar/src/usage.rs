//! Reads token usage out of a response as it streams past: `usage` of an OpenAI-shaped JSON body or of
//! an SSE chunk, or llama-server's native `tokens_evaluated` / `tokens_predicted`.

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

#[derive(Debug)]
pub struct UsageScanner {
    sse: bool,
    buf: Vec<u8>,
    gave_up: bool,
    found: Option<Usage>,
}

impl UsageScanner {
    /// `content_type` of the response decides between one JSON document and an event stream.
    pub fn new(content_type: Option<&str>) -> Self {
        let sse = content_type.is_some_and(|ct| ct.starts_with("text/event-stream"));
        UsageScanner {
            sse,
            buf: Vec::new(),
            gave_up: false,
            found: None,
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        if self.gave_up {
            return;
        }
        self.buf.extend_from_slice(chunk);
        if !self.sse {
            if self.buf.len() > MAX_JSON_BUFFER {
                self.gave_up = true;
                self.buf = Vec::new();
            }
            return;
        }
        let mut start = 0;
        while let Some(nl) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let line = &self.buf[start..start + nl];
            if let Some(u) = sse_line_usage(line) {
                self.found = Some(u);
            }
            start += nl + 1;
        }
        self.buf.drain(..start);
        if self.buf.len() > MAX_SSE_LINE {
            self.buf.clear();
        }
    }

    /// The last usage seen (streams), or the usage of the whole body (JSON).
    pub fn finish(&mut self) -> Option<Usage> {
        if !self.sse && !self.gave_up && !self.buf.is_empty() {
            self.found = serde_json::from_slice::<Value>(&self.buf)
                .ok()
                .as_ref()
                .and_then(extract);
            self.buf = Vec::new();
        }
        if self.sse && !self.buf.is_empty() {
            if let Some(u) = sse_line_usage(&self.buf) {
                self.found = Some(u);
            }
            self.buf.clear();
        }
        self.found
    }
}

fn sse_line_usage(line: &[u8]) -> Option<Usage> {
    let data = line.strip_prefix(b"data:")?;
    // Cheap filter: most chunks carry one token and no usage.
    let has = |needle: &[u8]| data.windows(needle.len()).any(|w| w == needle);
    if !has(b"\"usage\"") && !has(b"\"tokens_predicted\"") {
        return None;
    }
    serde_json::from_slice::<Value>(data.trim_ascii())
        .ok()
        .as_ref()
        .and_then(extract)
}

fn extract(v: &Value) -> Option<Usage> {
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        return Some(Usage {
            prompt_tokens: u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
            completion_tokens: u
                .get("completion_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        });
    }
    let predicted = v.get("tokens_predicted").and_then(Value::as_u64);
    let evaluated = v.get("tokens_evaluated").and_then(Value::as_u64);
    if predicted.is_some() || evaluated.is_some() {
        return Some(Usage {
            prompt_tokens: evaluated.unwrap_or(0),
            completion_tokens: predicted.unwrap_or(0),
        });
    }
    None
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

    #[test]
    fn no_usage_is_none() {
        let mut s = UsageScanner::new(Some("application/json"));
        s.feed(b"{\"tokens\":[1,2,3]}");
        assert_eq!(s.finish(), None);
    }
}
