//! The shutdown trigger: SIGTERM or SIGINT. The first starts the graceful drain; a second, during
//! the drain, stops at once (as an operator pressing Ctrl-C twice means).

use tokio::signal::unix::{signal, Signal, SignalKind};

/// SIGTERM and SIGINT, listened for from the moment this is made.
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    pub fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves on the next SIGTERM or SIGINT, with its name.
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
