//! The thread that writes policy budgets behind the request path (`state.dir`): every
//! `state.flush-interval` what changed goes to disk in one commit, and once more when slotgate
//! stops. A failing disk is logged (at once, then once a minute while it lasts) and counted; what
//! could not be written is tried again.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::budgets::Budgets;
use crate::metrics as m;
use crate::store::ledger::Ledger;

/// How often a failing disk is logged again.
const ERROR_EVERY: Duration = Duration::from_secs(60);

/// Stops the writer, after a last write, when dropped.
pub struct Persister {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Persister {
    pub fn start(
        shared: Arc<Budgets>,
        ledger: Arc<Ledger>,
        every: Duration,
    ) -> std::io::Result<Persister> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("slotgate-state".into())
            .spawn(move || {
                let mut failing_since: Option<Instant> = None;
                let mut logged: Option<Instant> = None;
                loop {
                    let last = !matches!(
                        stopped.recv_timeout(every),
                        Err(mpsc::RecvTimeoutError::Timeout)
                    );
                    let written = shared.persist().and_then(|n| {
                        Ok(n + ledger.persist(crate::budgets::wall_ms())?)
                    });
                    match written {
                        Ok(n) => {
                            if n > 0 {
                                metrics::counter!(m::STATE_WRITES_TOTAL, "result" => "ok")
                                    .increment(1);
                                metrics::counter!(m::STATE_ROWS_WRITTEN_TOTAL).increment(n as u64);
                            }
                            if let Some(since) = failing_since.take() {
                                tracing::info!(failed_for = ?since.elapsed(), "policy budgets are written to disk again");
                            }
                        }
                        Err(e) => {
                            metrics::counter!(m::STATE_WRITES_TOTAL, "result" => "error")
                                .increment(1);
                            failing_since.get_or_insert_with(Instant::now);
                            if logged.is_none_or(|t| t.elapsed() >= ERROR_EVERY) {
                                logged = Some(Instant::now());
                                tracing::error!(error = %e, "policy budgets cannot be written to disk: they are kept in memory and tried again; a restart now would lose what changed since the last write");
                            }
                        }
                    }
                    if last {
                        break;
                    }
                }
            })?;
        Ok(Persister {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Persister {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
