//! The state every request shares: the configuration, the slots and queue, the upstream client and
//! what it can hold, the policy chain, the prompt counter and llama-server's CORS rule. Built once
//! by `app::run`; read by the request path (`pipeline`), the admin endpoints and the reloader.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::admission::{Admission, Fairness, Stops};
use crate::config::{Config, Limits, Slots};
use crate::fleet::Fleet;
use crate::live::Live;
use crate::metrics as m;
use crate::policy::PolicySet;
use crate::router::{Defaults, Models};
use crate::upstream::capacity::Capacity;
use crate::upstream::cors::Cors;
use crate::upstream::quarantine::Quarantine;
use crate::upstream::tokenize::Counter;
use crate::upstream::Upstream;

/// Shared, read-only after start (the counters inside are atomics or behind short locks).
pub struct App {
    pub config: Config,
    pub admission: Admission,
    pub upstream: Upstream,
    pub limits: Limits,
    pub prometheus: PrometheusHandle,
    pub policies: PolicySet,
    /// Exact prompt counts, from llama-server.
    pub cost: Counter,
    /// Its slots, their context and the KV pool they may share.
    pub capacity: Capacity,
    /// In front of llama-server's router: a pool per model, and its loads.
    pub models: Models,
    /// Its CORS rule, for slotgate's own answers.
    pub cors: Cors,
    /// The conversations with a request waiting here, which llama-server's stop route ends.
    pub stops: Stops,
    /// Who started each conversation: the only caller who may read or stop it.
    pub owners: crate::admission::Owners,
    /// llama-server's verdicts on callers' keys, learnt before they are charged.
    pub verdicts: crate::upstream::verdicts::Verdicts,
    /// The keys slotgate issued (`--client-auth keys`).
    pub keys: Arc<crate::keys::Keys>,
    /// Holds the slot of a request llama-server may still run after an upstream timeout.
    pub quarantine: Arc<Quarantine>,
    /// The fleet state backend, when `state.backend = redis`.
    pub fleet: Option<Arc<Fleet>>,
    /// What is inside now: every request, tenant totals and a minute of history (`GET /live`).
    pub live: Live,
    /// Requests and tokens per tenant, model and day (`GET /usage`).
    pub ledger: Arc<crate::store::ledger::Ledger>,
    /// The admin tokens in force: those of the configuration, replaced by a reload that read new
    /// ones (`set_admin_tokens`).
    admin_tokens: std::sync::RwLock<crate::config::AdminTokens>,
    /// The `total_slots` last warned about (a fixed `--slots` that differs from it).
    warned_slots: AtomicUsize,
}

impl App {
    pub fn new(
        config: Config,
        prometheus: PrometheusHandle,
        policies: PolicySet,
        fleet: Option<Arc<Fleet>>,
        ledger: Arc<crate::store::ledger::Ledger>,
    ) -> Self {
        let slots = config.slots.initial();
        // Idle upstream connections kept: two per slot, for as many slots as `auto` may find.
        let pool = match config.slots {
            Slots::Auto => 32,
            Slots::Fixed(n) => n * 2,
        };
        let mut upstream = Upstream::new(
            config.upstream.clone(),
            config.connect_timeout,
            pool,
            config.upstream_api_key.as_ref().map(|k| k.0.as_str()),
        );
        // Under `wrap` (its command line known) slotgate starts llama-server itself.
        upstream.set_starts_it(config.launch.is_some());
        // The denominators of the busy and queue gauges, for dashboards and alerts.
        metrics::gauge!(crate::metrics::SLOTS_TOTAL).set(slots as f64);
        metrics::gauge!(m::SLOTS_MISMATCH).set(0.0);
        metrics::gauge!(crate::metrics::QUEUE_CAPACITY).set(config.queue_depth as f64);
        let fairness = Fairness {
            aging: config.priority_aging,
            tenant_limit: config.tenant_queue_limit(),
            reject_doomed: config.reject_doomed_waits,
            shed_from: config.sheddable_priority,
            refuse_at_cap: config.tenant_caps.over_cap == crate::config::OverCap::Refuse,
            cached_weight: crate::admission::CachedWeight::new(config.cached_token_weight),
        };
        let admission = Admission::with_fairness(slots, config.queue_depth, fairness);
        let bands = crate::admission::Bands::new(
            config
                .bands
                .iter()
                .map(|b| crate::admission::Band {
                    name: b.name.as_str().into(),
                    priorities: b.priorities,
                    slots: b.slots,
                    queue: b.queue,
                })
                .collect(),
        );
        admission.set_bands(bands.clone());
        let capacity = Capacity::new(upstream.clone(), config.kv_pool, config.launch.clone());
        let models = Models::new(
            Arc::new(upstream.clone()),
            capacity.router.clone(),
            Defaults {
                slots: config.slots,
                queue_depth: config.queue_depth,
                queue_timeout: config.queue_timeout,
                fairness,
                tenant_queue_share: config.tenant_queue_share,
                overrides: config.models.clone(),
                turns: config.model_turns,
                bands,
            },
        );
        App {
            models,
            policies,
            fleet,
            warned_slots: AtomicUsize::new(0),
            admin_tokens: std::sync::RwLock::new(config.admin.tokens),
            live: Live::new(),
            ledger,
            cost: Counter::new(config.tokenizer, upstream.clone()),
            capacity,
            cors: Cors::default(),
            stops: Stops::default(),
            owners: Default::default(),
            verdicts: Default::default(),
            keys: Arc::new(crate::keys::Keys::none()),
            quarantine: Arc::new(Quarantine::new(upstream.clone(), admission.clone())),
            admission,
            upstream,
            limits: Limits {
                max_body: config.max_body,
                body_timeout: config.body_timeout,
            },
            prometheus,
            config,
        }
    }

    /// The admin tokens in force now.
    pub fn admin_tokens(&self) -> crate::config::AdminTokens {
        *self
            .admin_tokens
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Puts `tokens` in force; says whether they differ from those before.
    pub fn set_admin_tokens(&self, tokens: crate::config::AdminTokens) -> bool {
        let mut now = self
            .admin_tokens
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::replace(&mut *now, tokens) != tokens
    }

    /// After llama-server's `/props` was read: admission follows its KV pool; `--slots auto` takes
    /// its `total_slots`; a fixed number that differs is warned about (once per change) and flagged
    /// in `slotgate_slots_mismatch` and `/status`.
    pub fn follow_upstream(&self) {
        if let Some(model) = self.capacity.served_model() {
            self.ledger.set_served_model(&model);
        }
        let pool = self.capacity.slot_context().and_then(|c| c.pool);
        self.admission.set_pool(pool);
        metrics::gauge!(m::KV_POOL_TOKENS).set(pool.unwrap_or(0) as f64);
        let Some(reported) = self.capacity.upstream_slots() else {
            return;
        };
        metrics::gauge!(m::UPSTREAM_SLOTS).set(reported as f64);
        let current = self.admission.slots();
        match self.config.slots {
            Slots::Auto if reported != current => {
                tracing::info!(
                    slots = reported,
                    was = current,
                    "slots follow llama-server's total_slots (--slots auto)"
                );
                self.admission.set_slots(reported);
                metrics::gauge!(m::SLOTS_TOTAL).set(reported as f64);
            }
            Slots::Auto => {}
            Slots::Fixed(fixed) => {
                let mismatch = fixed != reported;
                metrics::gauge!(m::SLOTS_MISMATCH).set(if mismatch { 1.0 } else { 0.0 });
                if mismatch && self.warned_slots.swap(reported, Ordering::Relaxed) != reported {
                    tracing::warn!(
                        slots = fixed,
                        upstream_total_slots = reported,
                        "--slots differs from llama-server's total_slots: {}",
                        if fixed > reported {
                            "the extra requests wait in llama-server's own unbounded queue"
                        } else {
                            "llama-server's extra slots stay idle"
                        }
                    );
                }
            }
        }
    }

    /// For `/status`: where the slot count comes from, what llama-server reports, whether they
    /// differ.
    pub fn slots_status(&self) -> serde_json::Value {
        let reported = self.capacity.upstream_slots();
        let total = self.admission.slots();
        serde_json::json!({
            "source": match (self.config.slots, reported) {
                (Slots::Fixed(_), _) => "fixed (--slots)",
                (Slots::Auto, Some(_)) => "auto (llama-server /props total_slots)",
                (Slots::Auto, None) => "auto (waiting for llama-server's /props; 1 until then)",
            },
            "upstream_total_slots": reported,
            "mismatch": reported.is_some_and(|r| r != total),
        })
    }
}
