//! The shutdown trigger: the first SIGTERM or SIGINT.

use tokio::signal::unix::{signal, SignalKind};

/// Resolves on the first SIGTERM or SIGINT.
pub async fn signal_received() -> std::io::Result<&'static str> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
