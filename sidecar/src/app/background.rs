//! The tasks beside the listeners on the main runtime, until the drain aborts them: the health
//! check that follows llama-server (readiness, capacity, CORS, a router's models), metrics upkeep,
//! the reloader, the watchdog and the fleet's sync.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::signal::unix::Signal;
use tokio::task::JoinHandle;

use super::reload::{self, ConfigSource};
use crate::state::App;

/// How often histogram summaries are compacted.
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// Starts every background task; the watchdog's already runs.
pub(super) fn start(
    app: &Arc<App>,
    source: ConfigSource,
    hangup: Signal,
    watchdog: Option<JoinHandle<()>>,
) -> Vec<JoinHandle<()>> {
    let mut background = vec![
        tokio::spawn(health_loop(app.clone())),
        tokio::spawn(upkeep_loop(app.prometheus.clone())),
        tokio::spawn(reload::run(app.clone(), source, hangup)),
    ];
    background.extend(watchdog);
    if app.keys.durable() {
        background.push(tokio::spawn(keys_loop(app.keys.clone())));
    }
    if let Some(fleet) = &app.fleet {
        let cfg = &app.config;
        tracing::info!(fleet = %cfg.state.fleet, on_unavailable = %cfg.state.on_unavailable, "policy budgets shared by the fleet (state backend: redis)");
        background.push(tokio::spawn(fleet.clone().run()));
    }
    background
}

/// Writes down the keys' last uses, a minute apart at most, off the request path; a blocking
/// commit, so on a thread of its own.
async fn keys_loop(keys: Arc<crate::keys::Keys>) {
    let mut every = tokio::time::interval(Duration::from_secs(30));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let keys = keys.clone();
        let _ = tokio::task::spawn_blocking(move || keys.write_last_used()).await;
    }
}

async fn health_loop(app: Arc<App>) {
    let timeout = app.config.connect_timeout + Duration::from_secs(1);
    let mut tick = tokio::time::interval(app.config.health_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let was_ready = app.upstream.is_ready();
        let ready = app.upstream.probe_health(timeout).await;
        // The slot context can change only across a restart of llama-server: read it when it
        // becomes ready, and until it has been read.
        // (A router's own /props has no slot context: its models' are read with its list.)
        let router = app.capacity.router.is_on();
        if ready && (!was_ready || (app.capacity.slot_context().is_none() && !router)) {
            app.capacity.refresh().await;
            app.follow_upstream();
            app.cors.learn(&app.upstream).await;
            app.verdicts.learn(&app.upstream).await;
        } else if ready && router {
            // In front of a router: its models' states, every check, and each pool follows.
            app.capacity.router.refresh(&app.upstream).await;
        }
        if ready && app.capacity.router.is_on() {
            app.models.follow();
        }
    }
}

async fn upkeep_loop(handle: PrometheusHandle) {
    let mut tick = tokio::time::interval(METRICS_UPKEEP);
    loop {
        tick.tick().await;
        handle.run_upkeep();
    }
}
