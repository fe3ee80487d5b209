//! The runtimes: one single-threaded tokio runtime per core, each accepting on every client
//! socket and serving the connections it accepted from start to end on its own thread. A request,
//! its timers and its upstream connection stay on one thread: no hand-over between threads on the
//! request path (measured against the bare stack in `scripts/bench.sh`: one work-stealing runtime
//! spends about a third more CPU per proxied request than a runtime per core).
//!
//! The main thread runs the first runtime (with the admin listener and the background tasks); the
//! others each run on a thread of their own until [`Workers::stop`].

use std::io;
use std::thread::JoinHandle;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::sync::oneshot;

/// A current-thread runtime as every worker runs it: log lines go out when it runs out of work.
pub fn runtime() -> io::Result<Runtime> {
    Builder::new_current_thread()
        .enable_all()
        .on_thread_park(crate::log::worker_idle)
        .on_thread_stop(crate::log::flush)
        .build()
}

/// How many runtimes to run: one per core the process may use.
pub fn count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The runtimes beyond the main thread's.
pub struct Workers {
    running: Vec<(Handle, oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Workers {
    /// Starts `n` runtimes, each on a thread of its own, idle until work is spawned on it.
    pub fn start(n: usize) -> io::Result<Workers> {
        let mut running = Vec::with_capacity(n);
        for i in 1..=n {
            let (handle_tx, handle_rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(format!("slotgate-worker-{i}"))
                .spawn(move || match runtime() {
                    Ok(rt) => {
                        crate::upstream::on_worker(i);
                        let _ = handle_tx.send(Ok(rt.handle().clone()));
                        rt.block_on(async {
                            let _ = stop_rx.await;
                        });
                    }
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                    }
                })?;
            let handle = handle_rx
                .recv()
                .map_err(|_| io::Error::other("a worker thread died at start"))??;
            running.push((handle, stop_tx, thread));
        }
        Ok(Workers { running })
    }

    /// Where to spawn work on each of them.
    pub fn handles(&self) -> Vec<Handle> {
        self.running.iter().map(|(h, _, _)| h.clone()).collect()
    }

    /// Ends each runtime (what still runs on it is dropped) and waits for its thread.
    pub fn stop(self) {
        for (_, stop, thread) in self.running {
            let _ = stop.send(());
            let _ = thread.join();
        }
    }
}
