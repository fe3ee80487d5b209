//! The admin scrape's copy of llama-server's own `/metrics`: one copy at a time, on connections
//! not counted as the request path's, and none for a while after one failed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::Method;

use super::pool::Pool;
use super::Upstream;

/// How long the admin scrape waits for llama-server's own `/metrics`.
const METRICS_COPY_TIMEOUT: Duration = Duration::from_secs(1);
/// After a failed copy, scrapes go without llama-server's series this long.
const METRICS_COPY_BACKOFF: Duration = Duration::from_secs(10);

/// The one copy of `/metrics` under way; the next may start once it is dropped.
struct ScrapeTurn<'a>(&'a AtomicBool);

impl Drop for ScrapeTurn<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The copy's connections and turn, shared by every clone of the [`Upstream`].
pub(super) struct Scrape {
    /// Keeps no idle connection, and is not counted in `slotgate_upstream_connections_total`.
    pool: Pool,
    /// A copy of `/metrics` is under way (one at a time).
    scraping: AtomicBool,
    /// No copy is tried before this (after one failed).
    skip_until: Mutex<Option<Instant>>,
}

impl Scrape {
    pub(super) fn new(pool: Pool) -> Self {
        Scrape {
            pool,
            scraping: AtomicBool::new(false),
            skip_until: Mutex::new(None),
        }
    }
}

impl Upstream {
    /// llama-server's own `/metrics` text for the admin scrape, on connections not counted as the
    /// request path's. `None` while another copy is under way or for [`METRICS_COPY_BACKOFF`] after
    /// one failed: a stuck llama-server gets no pile of `/metrics` requests to answer once it runs
    /// again.
    pub async fn metrics_copy(&self) -> Option<String> {
        let skip_until = || {
            self.inner
                .scrape
                .skip_until
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if skip_until().is_some_and(|t| Instant::now() < t) {
            return None;
        }
        if self.inner.scrape.scraping.swap(true, Ordering::AcqRel) {
            return None;
        }
        let _turn = ScrapeTurn(&self.inner.scrape.scraping);
        let copied = self
            .exchange(
                &self.inner.scrape.pool,
                Method::GET,
                "/metrics",
                None,
                METRICS_COPY_TIMEOUT,
            )
            .await
            .and_then(|b| String::from_utf8(b.to_vec()).map_err(|e| format!("not UTF-8: {e}")));
        match copied {
            Ok(text) => Some(text),
            Err(e) => {
                *skip_until() = Some(Instant::now() + METRICS_COPY_BACKOFF);
                tracing::debug!(error = %e, "llama-server /metrics not appended");
                None
            }
        }
    }
}
