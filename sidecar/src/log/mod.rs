//! The log sink: every line (tracing's and the access log's) goes to stderr whole. Lines written on
//! a runtime worker are batched in one buffer, written out when a worker runs out of work, when it
//! grows past [`FLUSH_AT`], before the admin listener answers, and at exit; lines of any other
//! thread are written at once, after what is batched. So a busy server makes one `write` for many
//! lines instead of one per request, and an idle one writes each line at once.
//!
//! The access line's formatter is in `line`; how a client's text is shown to an operator safely
//! (CLI tables, CSV) in `shown`.

use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::config::LogFormat;

mod line;
pub mod shown;

#[cfg(any(test, feature = "fuzzing"))]
pub use line::text_fields;
pub use line::{info_line, Field};

/// Bytes buffered before a writer writes them out itself.
const FLUSH_AT: usize = 64 << 10;

static PENDING: Mutex<Vec<u8>> = Mutex::new(Vec::new());
/// Lines are batched only once a flusher is in place (`batch`); before, each is written at once.
static BATCHING: AtomicBool = AtomicBool::new(false);
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Where tracing-subscriber writes: into the batch.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sink;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = Sink;

    fn make_writer(&'a self) -> Sink {
        Sink
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        line(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The format lines are in, as logging was set up (`None`: not set up by slotgate).
pub fn set_format(format: LogFormat) {
    let _ = FORMAT.set(format);
}

pub fn format() -> Option<LogFormat> {
    FORMAT.get().copied()
}

thread_local! {
    /// This thread is a runtime worker: it calls [`worker_idle`] whenever it runs out of work.
    static WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Starts batching: from now on the runtime's workers call [`worker_idle`] when they park.
pub fn batch() {
    BATCHING.store(true, Ordering::Release);
}

/// A worker has nothing to do: what is batched goes out. (The runtime's `on_thread_park`.)
pub fn worker_idle() {
    WORKER.with(|w| w.set(true));
    flush();
}

/// Writes whole lines: into the batch on a worker, else straight to stderr after the batch.
pub fn line(bytes: &[u8]) {
    if !BATCHING.load(Ordering::Acquire) || !WORKER.with(Cell::get) {
        flush();
        let _ = std::io::stderr().lock().write_all(bytes);
        return;
    }
    let full = {
        let mut pending = lock();
        pending.extend_from_slice(bytes);
        (pending.len() >= FLUSH_AT).then(|| std::mem::take(&mut *pending))
    };
    if let Some(out) = full {
        let _ = std::io::stderr().lock().write_all(&out);
    }
}

/// Writes out what is batched, outside the lock.
pub fn flush() {
    let out = {
        let mut pending = lock();
        if pending.is_empty() {
            return;
        }
        std::mem::replace(&mut *pending, Vec::with_capacity(8 << 10))
    };
    let _ = std::io::stderr().lock().write_all(&out);
}

fn lock() -> std::sync::MutexGuard<'static, Vec<u8>> {
    PENDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
