//! The state every request shares: the configuration, the slots and queue, the upstream client, the
//! policy chain and the prompt counter. Built once by `app::run`; read by the request path
//! (`pipeline`), the admin endpoints and the reloader.

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::admission::{Admission, Fairness};
use crate::config::Config;
use crate::cost::Counter;
use crate::fleet::Fleet;
use crate::intake::Limits;
use crate::policy::PolicySet;
use crate::upstream::Upstream;

/// Shared, read-only after start (the counters inside are atomics or behind short locks).
pub struct App {
    pub config: Config,
    pub admission: Admission,
    pub upstream: Upstream,
    pub limits: Limits,
    pub prometheus: PrometheusHandle,
    pub policies: PolicySet,
    /// Exact prompt counts and the slot context, from llama-server.
    pub cost: Counter,
    /// The fleet state backend, when `state.backend = redis`.
    pub fleet: Option<Arc<Fleet>>,
}

impl App {
    pub fn new(
        config: Config,
        prometheus: PrometheusHandle,
        policies: PolicySet,
        fleet: Option<Arc<Fleet>>,
    ) -> Self {
        let upstream = Upstream::new(
            config.upstream.clone(),
            config.connect_timeout,
            config.slots * 2,
        );
        // The denominators of the busy and queue gauges, for dashboards and alerts.
        metrics::gauge!(crate::metrics::SLOTS_TOTAL).set(config.slots as f64);
        metrics::gauge!(crate::metrics::QUEUE_CAPACITY).set(config.queue_depth as f64);
        App {
            policies,
            fleet,
            cost: Counter::new(config.tokenizer, upstream.clone()),
            admission: Admission::with_fairness(
                config.slots,
                config.queue_depth,
                Fairness {
                    aging: config.priority_aging,
                    tenant_limit: config.tenant_queue_limit(),
                    reject_doomed: config.reject_doomed_waits,
                },
            ),
            upstream,
            limits: Limits {
                max_body: config.max_body,
                body_timeout: config.body_timeout,
            },
            prometheus,
            config,
        }
    }
}
