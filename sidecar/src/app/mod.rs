//! Wiring and lifecycle: `run` binds everything, serves until a signal, then drains: stops
//! accepting, turns the queue away, drains in-flight responses for at most the drain timeout,
//! writes the state on the way out, and returns.

mod background;
mod bind;
mod drain;
pub mod memory;
pub mod persist;
pub mod reload;
mod serve;
pub mod signal;
mod starting;
pub mod workers;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::config::Config;
pub use bind::StartError;
use reload::ConfigSource;

/// Runs until SIGTERM/SIGINT, then shuts down gracefully. SIGHUP (and a change to a watched file)
/// reloads the policy chain from `source`.
/// Client connections are accepted and served on this runtime and on each of `workers`.
pub async fn run(
    config: Config,
    prometheus: PrometheusHandle,
    source: ConfigSource,
    workers: Vec<tokio::runtime::Handle>,
) -> Result<(), StartError> {
    let sockets = bind::listen(&config).await?;
    let starting = starting::Starting::new();
    let accepting = serve::accept(
        &config,
        (sockets.listeners, sockets.admin),
        &starting,
        &workers,
    );
    let signals = (sockets.hangup, sockets.notifier, sockets.watchdog);
    let bound = match bind::build(config, prometheus, signals, &starting).await {
        Ok(b) => b,
        Err(e) => {
            accepting.stop();
            return Err(e);
        }
    };
    starting.ready(bound.app.clone());
    let mut serving = serve::serve(bound, accepting, source);
    let signal = serving.signals.next().await;
    drain::drain(serving, signal).await;
    Ok(())
}
