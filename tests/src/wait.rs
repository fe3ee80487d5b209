//! Deadlines instead of sleeps: poll a condition until it holds or a bound passes; unique temp paths.

use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Polls `check` every 20 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fresh, empty directory under the system temp dir. Kept short: Unix socket paths max out at 108 bytes.
pub fn unique_dir(prefix: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir =
        std::env::temp_dir().join(format!("sg-{prefix}-{}-{n}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// The uid of this test process, read from a file it creates (no `unsafe` libc call needed).
pub fn current_uid() -> u32 {
    let dir = unique_dir("uid");
    let probe = dir.join("probe");
    std::fs::write(&probe, b"").expect("write uid probe");
    let uid = std::fs::metadata(&probe).expect("stat uid probe").uid();
    let _ = std::fs::remove_dir_all(&dir);
    uid
}

/// One timed scenario at a time in a test binary, across its modules.
static TIMED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Held by the tests that measure waits against bounds (fairness, Retry-After) on this 2-core
/// machine: two of them in one binary never run at once, though each may still run beside a test
/// that measures nothing, as it did beside the other tests of its own file.
pub async fn timing() -> tokio::sync::MutexGuard<'static, ()> {
    TIMED.lock().await
}
