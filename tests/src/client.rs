//! HTTP/1.1 client over a Unix or TCP socket: whole responses, streamed responses, and raw sockets.
//!
//! Every helper on [`Client`] opens its own connection. The connection's driver task is aborted when the
//! request future, [`Conn`] or [`Streaming`] is dropped, so dropping one really closes the socket: that is
//! how tests model a client that goes away.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::task::JoinHandle;

/// Where a [`Client`] connects.
#[derive(Clone, Debug)]
pub enum Target {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// Opens one connection per call to `target`.
#[derive(Clone, Debug)]
pub struct Client {
    target: Target,
    /// `Authorization` put on every request that carries none (an admin token).
    bearer: Option<String>,
}

/// A whole response: status, headers and the body read to the end as text.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

/// Asserts a forwarded response carries `x-slotgate-queue-wait-ms` as an integer and returns it.
pub fn queue_wait_ms(resp: &Response) -> u64 {
    let raw = resp.header("x-slotgate-queue-wait-ms").unwrap_or_else(|| {
        panic!(
            "forwarded response lacks x-slotgate-queue-wait-ms: {:?}",
            resp.headers
        )
    });
    raw.parse()
        .unwrap_or_else(|_| panic!("x-slotgate-queue-wait-ms is not an integer: {raw:?}"))
}

impl Response {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap_or_default().to_owned())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("response body is not JSON ({e}): {:?}", self.body))
    }

    /// The `fake_tag` the fake upstream echoed back, if any.
    pub fn tag(&self) -> Option<String> {
        self.json()
            .get("fake_tag")
            .and_then(|t| t.as_str())
            .map(str::to_owned)
    }
}

/// Aborts the connection driver when dropped, closing the socket.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One persistent (keep-alive) HTTP/1.1 connection. Dropping it closes the socket.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    _driver: AbortOnDrop,
}

/// A response whose body is read frame by frame as it arrives. Dropping it closes the connection.
pub struct Streaming {
    pub status: StatusCode,
    pub headers: HeaderMap,
    body: Incoming,
    /// Text already consumed by [`Streaming::first_event`], replayed by [`Streaming::read_sse`].
    consumed: String,
    _conn: Conn,
}

/// What a whole SSE body contained.
#[derive(Debug, Clone, Default)]
pub struct SseRead {
    /// The payload of every `data:` line except `[DONE]`, in order.
    pub data: Vec<String>,
    /// Whether `data: [DONE]` arrived.
    pub done: bool,
    /// The body read error, if the stream ended with one.
    pub error: Option<String>,
    /// All bytes received, as text.
    pub raw: String,
}

impl SseRead {
    /// True only for a stream that ended cleanly with `[DONE]`.
    pub fn complete(&self) -> bool {
        self.done && self.error.is_none()
    }
}

/// Parses `data:` payloads out of SSE text; returns (payloads without `[DONE]`, saw `[DONE]`).
pub fn parse_sse(text: &str) -> (Vec<String>, bool) {
    let mut data = Vec::new();
    let mut done = false;
    for line in text.lines() {
        if let Some(payload) = line.strip_prefix("data:") {
            let payload = payload.trim();
            if payload == "[DONE]" {
                done = true;
            } else {
                data.push(payload.to_owned());
            }
        }
    }
    (data, done)
}

/// A `method` request for `path` with a JSON `body` (which may be empty), as every helper here sends.
pub fn json_request(method: Method, path: &str, body: Bytes) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .expect("valid request")
}

/// A bare `GET path`, for [`Client::try_send`] and [`Conn::send`] (admin endpoints, probes).
pub fn get_request(path: &str) -> Request<Full<Bytes>> {
    Request::get(path)
        .header("host", "localhost")
        .body(Full::default())
        .expect("valid request")
}

/// A JSON POST request, for [`Conn::send`].
pub fn post(path: &str, body: &serde_json::Value) -> Request<Full<Bytes>> {
    json_request(Method::POST, path, Bytes::from(body.to_string()))
}

/// A JSON POST request with extra headers (e.g. `authorization`), for [`Conn::send`].
pub fn post_with_headers<K: AsRef<str>, V: AsRef<str>>(
    path: &str,
    body: &serde_json::Value,
    headers: &[(K, V)],
) -> Request<Full<Bytes>> {
    let mut req = post(path, body);
    for (name, value) in headers {
        req.headers_mut().insert(
            http::HeaderName::try_from(name.as_ref()).expect("valid header name"),
            http::HeaderValue::try_from(value.as_ref()).expect("valid header value"),
        );
    }
    req
}

/// The helpers without `try_` expect an answer: a transport error fails the test, naming the request.
fn answered<T>(method: &str, path: &str, sent: anyhow::Result<T>) -> T {
    sent.unwrap_or_else(|e| panic!("{method} {path} failed at transport level: {e:#}"))
}

impl Client {
    pub fn unix(path: impl AsRef<Path>) -> Self {
        Self {
            target: Target::Unix(path.as_ref().to_path_buf()),
            bearer: None,
        }
    }

    pub fn tcp(addr: SocketAddr) -> Self {
        Self {
            target: Target::Tcp(addr),
            bearer: None,
        }
    }

    /// The same client, sending `Authorization: Bearer <token>` on every request that has no
    /// `Authorization` of its own.
    pub fn with_bearer(mut self, token: &str) -> Self {
        self.bearer = Some(format!("Bearer {token}"));
        self
    }

    /// The same client without a bearer.
    pub fn without_bearer(mut self) -> Self {
        self.bearer = None;
        self
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Opens a persistent connection.
    pub async fn connect(&self) -> anyhow::Result<Conn> {
        match &self.target {
            Target::Unix(p) => {
                let s = UnixStream::connect(p)
                    .await
                    .with_context(|| format!("connect {}", p.display()))?;
                Conn::handshake(s).await
            }
            Target::Tcp(a) => {
                let s = TcpStream::connect(a)
                    .await
                    .with_context(|| format!("connect {a}"))?;
                Conn::handshake(s).await
            }
        }
    }

    /// Sends `req` on a fresh connection and reads the whole response.
    pub async fn try_send(&self, mut req: Request<Full<Bytes>>) -> anyhow::Result<Response> {
        if let Some(b) = &self.bearer {
            if !req.headers().contains_key(http::header::AUTHORIZATION) {
                req.headers_mut().insert(
                    http::header::AUTHORIZATION,
                    http::HeaderValue::try_from(b.as_str())?,
                );
            }
        }
        let mut conn = self.connect().await?;
        conn.send(req).await
    }

    pub async fn try_post_json(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> anyhow::Result<Response> {
        self.try_send(post(path, body)).await
    }

    /// POSTs `body` as JSON; panics on a transport error (a status is always expected).
    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> Response {
        answered("POST", path, self.try_post_json(path, body).await)
    }

    /// POSTs `body` as JSON with extra headers; panics on a transport error.
    pub async fn post_json_with_headers<K: AsRef<str>, V: AsRef<str>>(
        &self,
        path: &str,
        body: &serde_json::Value,
        headers: &[(K, V)],
    ) -> Response {
        let sent = self.try_send(post_with_headers(path, body, headers)).await;
        answered("POST", path, sent)
    }

    /// POSTs `req` (its body and its headers) to the chat path; panics on a transport error.
    pub async fn post_chat(&self, req: &crate::request::Req) -> Response {
        self.post_json_with_headers(crate::request::CHAT, &req.json(), req.headers())
            .await
    }

    /// POSTs raw bytes with a JSON content type (for malformed or oversized bodies).
    pub async fn post_raw(&self, path: &str, body: impl Into<Bytes>) -> Response {
        let sent = self
            .try_send(json_request(Method::POST, path, body.into()))
            .await;
        answered("POST", path, sent)
    }

    pub async fn request(&self, method: Method, path: &str) -> Response {
        let sent = self
            .try_send(json_request(method.clone(), path, Bytes::new()))
            .await;
        answered(method.as_str(), path, sent)
    }

    pub async fn get(&self, path: &str) -> Response {
        self.request(Method::GET, path).await
    }

    /// `GET path` with these headers and no body; panics on a transport error.
    pub async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        self.send_with(Method::GET, path, headers, "").await
    }

    /// Sends `method path` with exactly `body` and these headers (beside `host` and a JSON
    /// content type); panics on a transport error.
    pub async fn send_with(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Response {
        let mut req = json_request(method.clone(), path, body.into());
        for (name, value) in headers {
            req.headers_mut().insert(
                http::HeaderName::try_from(*name).expect("valid header name"),
                http::HeaderValue::try_from(*value).expect("valid header value"),
            );
        }
        answered(method.as_str(), path, self.try_send(req).await)
    }

    /// POSTs `body` and returns as soon as the response head arrives; the body is read incrementally.
    pub async fn try_stream(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> anyhow::Result<Streaming> {
        self.connect().await?.send_streaming(post(path, body)).await
    }

    pub async fn stream(&self, path: &str, body: &serde_json::Value) -> Streaming {
        answered("streaming POST", path, self.try_stream(path, body).await)
    }

    /// [`Client::stream`] with extra request headers.
    /// Streams `req` (its body and its headers) from the chat path; panics on a transport error.
    pub async fn stream_chat(&self, req: &crate::request::Req) -> Streaming {
        let path = crate::request::CHAT;
        let sent = async {
            let request = post_with_headers(path, &req.json(), req.headers());
            self.connect().await?.send_streaming(request).await
        };
        answered("streaming POST", path, sent.await)
    }

    pub async fn stream_with_headers(
        &self,
        path: &str,
        body: &serde_json::Value,
        headers: &[(&str, &str)],
    ) -> Streaming {
        let sent = async {
            self.connect()
                .await?
                .send_streaming(post_with_headers(path, body, headers))
                .await
        };
        answered("streaming POST", path, sent.await)
    }

    /// Writes `bytes` on a fresh raw Unix socket, then reads until the peer closes it or `timeout` passes.
    /// Returns what arrived and how long after the write the close came; `None` if it stayed open.
    pub async fn raw_exchange(
        &self,
        bytes: &[u8],
        timeout: Duration,
    ) -> Option<(Vec<u8>, Duration)> {
        let mut sock = self.raw_unix().await;
        sock.write_all(bytes)
            .await
            .unwrap_or_else(|e| panic!("write on a raw socket: {e}"));
        let t0 = Instant::now();
        let got = read_until_closed(&mut sock, timeout).await?;
        Some((got, t0.elapsed()))
    }

    /// A raw Unix socket to the listener, for slowloris and partial-body tests.
    pub async fn raw_unix(&self) -> UnixStream {
        match &self.target {
            Target::Unix(p) => UnixStream::connect(p)
                .await
                .unwrap_or_else(|e| panic!("connect {}: {e}", p.display())),
            Target::Tcp(_) => panic!("raw_unix on a TCP client"),
        }
    }
}

impl Conn {
    async fn handshake<T>(io: T) -> anyhow::Result<Conn>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = http1::handshake(TokioIo::new(io))
            .await
            .context("http1 handshake")?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn {
            sender,
            _driver: AbortOnDrop(driver),
        })
    }

    /// Sends `req` and waits for the response head.
    async fn head(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> anyhow::Result<http::Response<Incoming>> {
        self.sender.ready().await.context("connection not ready")?;
        self.sender.send_request(req).await.context("send request")
    }

    /// Sends `req` on this connection and reads the whole response body.
    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> anyhow::Result<Response> {
        let (parts, body) = self.head(req).await?.into_parts();
        let bytes = body
            .collect()
            .await
            .context("read response body")?
            .to_bytes();
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }

    pub async fn post_json(
        &mut self,
        path: &str,
        body: &serde_json::Value,
    ) -> anyhow::Result<Response> {
        self.send(post(path, body)).await
    }

    pub async fn get(&mut self, path: &str) -> anyhow::Result<Response> {
        self.send(json_request(Method::GET, path, Bytes::new()))
            .await
    }

    /// Sends `req` and returns once the head arrives; the connection lives inside the [`Streaming`].
    pub async fn send_streaming(mut self, req: Request<Full<Bytes>>) -> anyhow::Result<Streaming> {
        let (parts, body) = self.head(req).await?.into_parts();
        Ok(Streaming {
            status: parts.status,
            headers: parts.headers,
            body,
            consumed: String::new(),
            _conn: self,
        })
    }
}

impl Streaming {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap_or_default().to_owned())
    }

    /// The next data chunk: `None` at the clean end, `Some(Err)` if the body broke.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, String>> {
        loop {
            match self.body.frame().await? {
                Ok(frame) => match frame.into_data() {
                    Ok(data) if data.is_empty() => continue,
                    Ok(data) => return Some(Ok(data)),
                    Err(_trailers) => continue,
                },
                Err(e) => return Some(Err(format!("{e:#}"))),
            }
        }
    }

    /// Like [`Self::next_chunk`] but panics if nothing (not even the end) arrives within `timeout`.
    pub async fn next_chunk_within(&mut self, timeout: Duration) -> Option<Result<Bytes, String>> {
        tokio::time::timeout(timeout, self.next_chunk())
            .await
            .unwrap_or_else(|_| panic!("no chunk within {timeout:?}"))
    }

    /// Reads until at least one full SSE `data:` event has arrived; returns the text read so far.
    /// The text is kept, so a later [`Self::read_sse`] still sees the whole stream.
    pub async fn first_event(&mut self, timeout: Duration) -> String {
        loop {
            match self.next_chunk_within(timeout).await {
                Some(Ok(b)) => {
                    self.consumed.push_str(&String::from_utf8_lossy(&b));
                    if self.consumed.contains("\n\n") {
                        return self.consumed.clone();
                    }
                }
                other => panic!(
                    "stream ended before the first event: {other:?}, read {:?}",
                    self.consumed
                ),
            }
        }
    }

    /// Reads the body to its end (clean or broken), bounded by `timeout`, and parses all of it as SSE.
    pub async fn read_sse(mut self, timeout: Duration) -> SseRead {
        let mut raw = std::mem::take(&mut self.consumed);
        let mut error = None;
        let read = async {
            while let Some(chunk) = self.next_chunk().await {
                match chunk {
                    Ok(b) => raw.push_str(&String::from_utf8_lossy(&b)),
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
        };
        if tokio::time::timeout(timeout, read).await.is_err() {
            panic!("stream did not end within {timeout:?}");
        }
        let (data, done) = parse_sse(&raw);
        SseRead {
            data,
            done,
            error,
            raw,
        }
    }

    /// Reads the body to the end as text (for non-SSE streamed responses).
    pub async fn read_all(self, timeout: Duration) -> SseRead {
        self.read_sse(timeout).await
    }
}

/// Reads from a raw socket until the peer closes it or `timeout` passes.
/// Returns `Some(bytes read)` if the peer closed (EOF or reset), `None` if the socket was still open.
pub async fn read_until_closed<S: AsyncRead + Unpin>(
    stream: &mut S,
    timeout: Duration,
) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(()) => Some(got),
        Err(_) => None,
    }
}

/// The status code of a raw HTTP/1.1 response (`HTTP/1.1 408 ...`), if the bytes start with one.
pub fn raw_status(bytes: &[u8]) -> Option<u16> {
    let text = String::from_utf8_lossy(bytes);
    let line = text.lines().next()?;
    let mut parts = line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    parts.next()?.parse().ok()
}

/// The body of a raw HTTP/1.1 response (after the blank line), as text.
pub fn raw_body(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// A raw HTTP/1.1 POST with a JSON body and `Content-Length`; `extra` header lines (without CRLF)
/// go after `Host` and `Content-Type`.
pub fn raw_post(path: &str, body: &str, extra: &[&str]) -> Vec<u8> {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for line in extra {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head.push_str(body);
    head.into_bytes()
}

/// One response parsed out of raw bytes by [`raw_responses`].
#[derive(Clone)]
pub struct RawResponse {
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub version: String,
    pub status: u16,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body with any chunked framing removed.
    pub body: Vec<u8>,
    /// Whether the body came in chunked encoding, and its terminating chunk arrived.
    pub chunked: bool,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The body as text: a failing assertion should show what arrived, not a list of byte values.
impl std::fmt::Debug for RawResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawResponse")
            .field("version", &self.version)
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &self.text())
            .field("chunked", &self.chunked)
            .finish()
    }
}

/// Splits what a raw connection received into its responses, in order. Each body is framed by
/// `Content-Length`, by chunked encoding, or (for a response with neither) by the connection's close;
/// 1xx, 204 and 304 responses have none. Panics on bytes that are not whole HTTP/1.x responses, so
/// a test cannot mistake a cut answer for a complete one.
pub fn raw_responses(bytes: &[u8]) -> Vec<RawResponse> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let end = rest
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| {
                panic!(
                    "an incomplete response head: {:?}",
                    String::from_utf8_lossy(rest)
                )
            });
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        rest = &rest[end + 4..];
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.split_whitespace();
        let version = parts.next().unwrap_or_default().to_owned();
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .filter(|_| version.starts_with("HTTP/1."))
            .unwrap_or_else(|| panic!("not an HTTP/1.x status line: {status_line:?}"));
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let mut resp = RawResponse {
            version,
            status,
            headers,
            body: Vec::new(),
            chunked: false,
        };
        let bodiless = (100..200).contains(&status) || status == 204 || status == 304;
        let chunked = resp
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let length = resp
            .header("content-length")
            .map(|v| v.parse::<usize>().expect("a numeric Content-Length"));
        if bodiless {
            // Nothing follows the head of these, whatever their headers say.
        } else if chunked {
            rest = dechunk(rest, &mut resp.body);
            resp.chunked = true;
        } else if let Some(len) = length {
            assert!(
                rest.len() >= len,
                "a body cut short: {} of {len} bytes",
                rest.len()
            );
            resp.body = rest[..len].to_vec();
            rest = &rest[len..];
        } else {
            resp.body = rest.to_vec();
            rest = &[];
        }
        out.push(resp);
    }
    out
}

/// Appends the data of the chunked body at the start of `bytes` to `body`; returns what follows it.
fn dechunk<'a>(mut bytes: &'a [u8], body: &mut Vec<u8>) -> &'a [u8] {
    loop {
        let eol = bytes
            .windows(2)
            .position(|w| w == b"\r\n")
            .unwrap_or_else(|| panic!("a chunked body cut short after {} bytes", body.len()));
        let size_text = String::from_utf8_lossy(&bytes[..eol]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .unwrap_or_else(|_| panic!("a bad chunk size {size_text:?}"));
        bytes = &bytes[eol + 2..];
        if size == 0 {
            // No trailers are expected: the terminating chunk ends with an empty line.
            assert!(
                bytes.starts_with(b"\r\n"),
                "no empty line after the last chunk"
            );
            return &bytes[2..];
        }
        assert!(
            bytes.len() >= size + 2,
            "a chunk cut short: {} of {size} bytes",
            bytes.len()
        );
        body.extend_from_slice(&bytes[..size]);
        assert_eq!(&bytes[size..size + 2], b"\r\n", "a chunk without its CRLF");
        bytes = &bytes[size + 2..];
    }
}
