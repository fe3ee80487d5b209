//! The log sink: every line (tracing's and the access log's) goes to stderr whole. Lines written on
//! a runtime worker are batched in one buffer, written out when a worker runs out of work, when it
//! grows past [`FLUSH_AT`], before the admin listener answers, and at exit; lines of any other
//! thread are written at once, after what is batched. So a busy server makes one `write` for many
//! lines instead of one per request, and an idle one writes each line at once.
//!
//! Also the access line's own formatter: the same line tracing-subscriber prints (text or JSON,
//! checked by a test), built without its field visitors.

use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::LogFormat;

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

/// One field of a line: a string (quoted and escaped in JSON) or a number.
pub enum Field<'a> {
    Str(&'a str),
    Num(u64),
    Int(i64),
    /// An address, written as a string.
    Addr(std::net::SocketAddr),
}

/// Appends an INFO line of `target` with `message` and `fields` (those `None` left out), in the
/// format tracing-subscriber prints it, with `now` as its time.
pub fn info_line(
    out: &mut Vec<u8>,
    format: LogFormat,
    now: SystemTime,
    target: &str,
    message: &str,
    fields: &[(&str, Option<Field<'_>>)],
) {
    match format {
        LogFormat::Json => {
            out.extend_from_slice(b"{\"timestamp\":\"");
            timestamp(out, now);
            out.extend_from_slice(b"\",\"level\":\"INFO\",\"message\":");
            json_str(out, message);
            for (name, value) in fields {
                let Some(value) = value else { continue };
                out.push(b',');
                json_str(out, name);
                out.push(b':');
                match value {
                    Field::Str(s) => json_str(out, s),
                    Field::Num(n) => {
                        out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes())
                    }
                    Field::Int(n) => {
                        out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes())
                    }
                    Field::Addr(a) => {
                        let _ = write!(out, "\"{a}\"");
                    }
                }
            }
            out.extend_from_slice(b",\"target\":");
            json_str(out, target);
            out.extend_from_slice(b"}\n");
        }
        LogFormat::Text => {
            timestamp(out, now);
            out.extend_from_slice(b"  INFO ");
            out.extend_from_slice(target.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(message.as_bytes());
            for (name, value) in fields {
                let Some(value) = value else { continue };
                let _ = match value {
                    Field::Str(s) => write!(out, " {name}={s}"),
                    Field::Num(n) => write!(out, " {name}={n}"),
                    Field::Int(n) => write!(out, " {name}={n}"),
                    Field::Addr(a) => write!(out, " {name}={a}"),
                };
            }
            out.push(b'\n');
        }
    }
}

fn json_str(out: &mut Vec<u8>, s: &str) {
    // Field names and most values need no escape: copied as they are.
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    let _ = serde_json::to_writer(&mut *out, s);
}

/// RFC 3339 in UTC with microseconds, as tracing-subscriber's `SystemTime` prints it.
fn timestamp(out: &mut Vec<u8>, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    if !(0..=9999).contains(&y) {
        let _ = write!(out, "{y:04}-{m:02}-{d:02}T");
    } else {
        digits(out, y as u32, 4);
        out.push(b'-');
        digits(out, m, 2);
        out.push(b'-');
        digits(out, d, 2);
        out.push(b'T');
    }
    // Digit by digit: `write!` with its padding cost more than the rest of an access line.
    digits(out, (rem / 3600) as u32, 2);
    out.push(b':');
    digits(out, (rem / 60 % 60) as u32, 2);
    out.push(b':');
    digits(out, (rem % 60) as u32, 2);
    out.push(b'.');
    digits(out, since.subsec_micros(), 6);
    out.push(b'Z');
}

/// The last `width` decimal digits of `n`, zero-padded.
fn digits(out: &mut Vec<u8>, mut n: u32, width: usize) {
    let start = out.len();
    out.resize(start + width, b'0');
    for slot in out[start..].iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_423), (2025, 12, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        let mut out = Vec::new();
        timestamp(
            &mut out,
            UNIX_EPOCH + Duration::from_micros(1_764_547_200_123_456),
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "2025-12-01T00:00:00.123456Z"
        );
    }

    #[test]
    fn strings_are_quoted_as_serde_json_quotes_them() {
        for s in [
            "",
            "plain",
            "q\"uote",
            "back\\slash",
            "tab\t",
            "nl\n",
            "\u{1}",
            "\u{7f}",
            "é ü 日本",
        ] {
            let mut ours = Vec::new();
            json_str(&mut ours, s);
            assert_eq!(ours, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }

    /// What tracing-subscriber prints for the same event, in the format slotgate sets up.
    fn via_tracing(format: LogFormat) -> String {
        #[derive(Clone, Default)]
        struct Capture(Arc<Mutex<Vec<u8>>>);
        impl Write for Capture {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let capture = Capture::default();
        let sink = capture.clone();
        let builder = tracing_subscriber::fmt().with_writer(move || sink.clone());
        let emit = || {
            tracing::info!(
                target: "slotgate::access",
                outcome = %"ok",
                status = 200u16,
                path = %"/v1/chat \"q\"",
                priority = -3i64,
                tenant = None::<tracing::field::DisplayValue<&str>>,
                total_ms = 7u64,
                "request"
            )
        };
        match format {
            LogFormat::Json => {
                tracing::subscriber::with_default(builder.json().flatten_event(true).finish(), emit)
            }
            LogFormat::Text => {
                tracing::subscriber::with_default(builder.with_ansi(false).finish(), emit)
            }
        }
        let out = capture.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_access_line_is_the_one_tracing_prints() {
        for format in [LogFormat::Json, LogFormat::Text] {
            let theirs = via_tracing(format);
            let mut ours = Vec::new();
            info_line(
                &mut ours,
                format,
                SystemTime::now(),
                "slotgate::access",
                "request",
                &[
                    ("outcome", Some(Field::Str("ok"))),
                    ("status", Some(Field::Num(200))),
                    ("path", Some(Field::Str("/v1/chat \"q\""))),
                    ("priority", Some(Field::Int(-3))),
                    ("tenant", None),
                    ("total_ms", Some(Field::Num(7))),
                ],
            );
            let ours = String::from_utf8(ours).unwrap();
            // The same line but for the time it was made.
            let skip = |s: &str| s.replacen(|c: char| c.is_ascii_digit(), "0", usize::MAX);
            assert_eq!(skip(&ours), skip(&theirs), "{format:?}");
        }
    }
}
