//! The way out, on the first SIGTERM or SIGINT: stop accepting, turn the queue away, wait for the
//! open connections for at most the drain timeout (a second signal stops at once), let the last
//! settlements finish, give the fleet its unused leases back, stop the admin listener and the
//! background tasks, and write the budgets a last time.

use std::time::Duration;

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use super::serve::Serving;
use crate::state::App;

/// Shuts down what [`serve`](super::serve::serve) started, on `signal`.
pub(super) async fn drain(mut s: Serving, signal: &'static str) {
    let app = s.app;
    let cfg = &app.config;
    tracing::info!(signal, drain_timeout = ?cfg.drain_timeout, "shutting down: no new connections, queue turned away, draining in-flight responses");
    s.notifier.stopping(&format!(
        "{signal}: draining in-flight responses for at most {:?}",
        cfg.drain_timeout
    ));
    // A second signal during the drain: stop now.
    tokio::select! {
        () = close_connections(&app, &s.stop, s.accepting, &s.conns) => {}
        again = s.signals.next() => {
            crate::pipeline::access::cut_by_shutdown();
            let _ = s.stop.send(true);
            app.admission.close(1);
            app.models.close(1);
            tracing::warn!(
                signal = again,
                still_open = cfg.max_connections - s.conns.available_permits(),
                "second signal: stopping at once, closing the remaining connections"
            );
        }
    }
    // The last requests' settlements, before the budgets are written on the way out.
    let unsettled = app.policies.completions_done(Duration::from_secs(2)).await;
    if unsettled > 0 {
        tracing::warn!(
            unsettled,
            "policy settlements still running at exit: those requests stay charged their estimate"
        );
    }
    // Unused leased tokens go back to the fleet.
    if let Some(fleet) = &app.fleet {
        fleet.release_all(Duration::from_secs(1)).await;
    }
    let _ = s.admin_stop.send(true);
    if let Some(task) = s.admin {
        let _ = task.await;
    }
    for task in s.background {
        task.abort();
    }
    // Last, the budgets' final write (the persister's Drop), once nothing else runs.
    drop(app);
    drop(s.persister);
}

/// The graceful part: no new connections, the queue turned away, the open ones given the drain
/// timeout to finish.
async fn close_connections(
    app: &App,
    stop: &watch::Sender<bool>,
    accepting: Vec<JoinHandle<()>>,
    conns: &Semaphore,
) {
    let cfg = &app.config;
    // 1. Stop accepting; each accept loop drops (and so unlinks, unless systemd's) its socket.
    //    Open connections finish the request they are on, then close.
    let _ = stop.send(true);
    for task in accepting {
        let _ = task.await;
    }
    // 2. Everyone still waiting gets a 503 with Retry-After instead of a slot.
    let retry_after = cfg.drain_timeout.as_secs().max(1);
    app.admission.close(retry_after);
    app.models.close(retry_after);
    // 3. Wait for every client connection to finish, for at most the drain timeout.
    let all = u32::try_from(cfg.max_connections).unwrap_or(u32::MAX);
    match tokio::time::timeout(cfg.drain_timeout, conns.acquire_many(all)).await {
        Ok(_) => tracing::info!("drained; exiting"),
        Err(_) => {
            crate::pipeline::access::cut_by_shutdown();
            tracing::warn!(
                still_open = cfg.max_connections - conns.available_permits(),
                "drain timeout reached; closing the remaining connections"
            )
        }
    }
}
