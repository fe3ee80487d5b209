//! Write-progress watch for one client connection: notices a client that has stopped taking bytes
//! while a response waits for it, so it cannot hold a slot by keeping its connection open.
//!
//! The socket says when a client stops reading: a write returns `Pending` once the kernel's send
//! buffer is full, and the next write succeeds only after the client has taken bytes. `Watched`
//! wraps the client's stream and notes when writing became blocked; `stalled` resolves once it has
//! stayed blocked for the whole stall timeout. A reader that keeps taking bytes, however slowly,
//! frees buffer space and unblocks writing before that, so it is never cut. The same handle carries
//! the facts the connection needs at its end: whether it was cut for a stall, whether a request
//! body was left unread (then the connection closes lingering, so the client can read the answer),
//! and whether the client sent anything, or a whole head (for the connection limits).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// `blocked_since` when writing is not blocked.
const NOT_BLOCKED: u64 = u64::MAX;

/// Shared by the connection, its stream wrapper and the request's response body.
#[derive(Clone)]
pub struct WriteWatch {
    inner: Arc<State>,
}

struct State {
    base: Instant,
    /// Milliseconds since `base` at which the current blocked stretch began.
    blocked_since: AtomicU64,
    /// Woken when writing becomes blocked.
    blocked: Notify,
    stalled: AtomicBool,
    unread_body: AtomicBool,
    /// The client has sent a byte.
    heard: AtomicBool,
    /// A whole request head has come.
    headed: AtomicBool,
}

impl Default for WriteWatch {
    fn default() -> Self {
        Self::new()
    }
}

impl WriteWatch {
    pub fn new() -> Self {
        WriteWatch {
            inner: Arc::new(State {
                base: Instant::now(),
                blocked_since: AtomicU64::new(NOT_BLOCKED),
                blocked: Notify::new(),
                stalled: AtomicBool::new(false),
                unread_body: AtomicBool::new(false),
                heard: AtomicBool::new(false),
                headed: AtomicBool::new(false),
            }),
        }
    }

    fn blocked(&self) {
        let now = self.inner.base.elapsed().as_millis() as u64;
        if self
            .inner
            .blocked_since
            .compare_exchange(NOT_BLOCKED, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.inner.blocked.notify_one();
        }
    }

    fn progressed(&self) {
        // A plain load first: the common case (never blocked) writes nothing shared.
        if self.inner.blocked_since.load(Ordering::Relaxed) != NOT_BLOCKED {
            self.inner
                .blocked_since
                .store(NOT_BLOCKED, Ordering::Relaxed);
        }
    }

    fn blocked_since(&self) -> Option<u64> {
        match self.inner.blocked_since.load(Ordering::Relaxed) {
            NOT_BLOCKED => None,
            ms => Some(ms),
        }
    }

    /// Resolves once writing has stayed blocked for `timeout`, and marks the connection stalled.
    pub async fn stalled(&self, timeout: Duration) {
        loop {
            match self.blocked_since() {
                None => self.inner.blocked.notified().await,
                Some(since) => {
                    let at = self.inner.base + Duration::from_millis(since) + timeout;
                    tokio::time::sleep_until(at).await;
                    if self.blocked_since() == Some(since) {
                        self.inner.stalled.store(true, Ordering::Relaxed);
                        return;
                    }
                }
            }
        }
    }

    /// The connection was cut because its client stopped reading.
    pub fn is_stalled(&self) -> bool {
        self.inner.stalled.load(Ordering::Relaxed)
    }

    /// A response went out before the request's body was read to its end.
    pub fn mark_unread_body(&self) {
        self.inner.unread_body.store(true, Ordering::Relaxed);
    }

    pub fn has_unread_body(&self) -> bool {
        self.inner.unread_body.load(Ordering::Relaxed)
    }

    /// The client has sent at least one byte.
    pub fn heard(&self) -> bool {
        self.inner.heard.load(Ordering::Relaxed)
    }

    /// A whole request head has come.
    pub fn mark_headed(&self) {
        if !self.headed() {
            self.inner.headed.store(true, Ordering::Relaxed);
        }
    }

    /// Whether one has: a header timeout before it is a slow head, after it an idle keep-alive.
    pub fn headed(&self) -> bool {
        self.inner.headed.load(Ordering::Relaxed)
    }
}

/// A client stream whose writes report to a [`WriteWatch`].
pub struct Watched<S> {
    stream: S,
    watch: WriteWatch,
    /// `watch.heard()`, kept here so later reads touch nothing shared.
    heard: bool,
}

impl<S> Watched<S> {
    pub fn new(stream: S, watch: WriteWatch) -> Self {
        Watched {
            stream,
            watch,
            heard: false,
        }
    }

    pub fn into_inner(self) -> S {
        self.stream
    }

    fn note<T>(
        &self,
        polled: Poll<io::Result<T>>,
        wrote: impl Fn(&T) -> bool,
    ) -> Poll<io::Result<T>> {
        match &polled {
            Poll::Pending => self.watch.blocked(),
            Poll::Ready(Ok(n)) if wrote(n) => self.watch.progressed(),
            Poll::Ready(_) => {}
        }
        polled
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if !self.heard && buf.filled().len() > before {
            self.heard = true;
            self.watch.inner.heard.store(true, Ordering::Relaxed);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.note(polled, |n| *n > 0)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.note(polled, |n| *n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.note(polled, |_| false)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn blocked_for_the_whole_timeout_is_a_stall() {
        let w = WriteWatch::new();
        w.blocked();
        let started = Instant::now();
        w.stalled(Duration::from_secs(30)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert!(w.is_stalled());
    }

    #[tokio::test(start_paused = true)]
    async fn progress_restarts_the_clock() {
        let w = WriteWatch::new();
        let watcher = {
            let w = w.clone();
            tokio::spawn(async move { w.stalled(Duration::from_secs(30)).await })
        };
        // Blocked, then a byte taken every 20 s: never 30 s without progress.
        for _ in 0..5 {
            w.blocked();
            tokio::time::sleep(Duration::from_secs(20)).await;
            w.progressed();
            tokio::task::yield_now().await;
        }
        assert!(!watcher.is_finished());
        assert!(!w.is_stalled());
        w.blocked();
        tokio::time::sleep(Duration::from_secs(31)).await;
        watcher.await.unwrap();
        assert!(w.is_stalled());
    }

    #[tokio::test(start_paused = true)]
    async fn never_blocked_never_stalls() {
        let w = WriteWatch::new();
        let r = tokio::time::timeout(Duration::from_secs(3600), w.stalled(Duration::from_secs(1)))
            .await;
        assert!(r.is_err());
        assert!(!w.is_stalled());
    }
}
