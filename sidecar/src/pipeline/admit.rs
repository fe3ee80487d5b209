//! The admit phase: what a slot request holds (slots, KV pool tokens), its claim (tenant, cost,
//! weight, priority), and a slot: at once when one is free and nobody waits, else in its fair place
//! in the queue, or a 429/504.

use std::sync::Arc;
use std::time::Duration;

use slotgate_sdk::{Decision, RequestSummary};
use tokio::time::Instant;

use crate::admission::{Claim, Demand, Entry, SlotGuard, TenantCap, Ticket};
use crate::error::GateError;
use crate::live::Phase;
use crate::state::App;
use crate::upstream::models::Pool;
use crate::upstream::router::Known;
use crate::upstream::tokenize;

use super::access::Exchange;
use super::count::{count_prompt, demand_of, Before};
use super::decide::Decided;
use super::intake::Intake;
use super::Ctx;

/// An admitted request: its slot (a slot route's), how long it waited, and by when it must have
/// been sent.
pub(super) struct Admitted {
    pub slot: Option<SlotGuard>,
    pub queue_wait: Duration,
    pub deadline: Instant,
    /// In front of llama-server's router, its model loaded by slotgate: forwarded with
    /// `?autoload=false`, so the router never loads (nor evicts) on its own for it.
    pub no_autoload: bool,
}

/// In front of llama-server's router, the pool of the model a request names (see
/// `upstream::models`); `None` otherwise, or for a model it does not list (yet: the list may be
/// read again). Looked up once per request.
pub(super) fn model_pool(app: &App, intake: &Intake) -> Option<Arc<Pool>> {
    if let Some(pool) = intake.pool.get() {
        return Some(pool.clone());
    }
    let pool = app.models.pool_for(intake.summary.model.as_deref()?)?;
    Some(intake.pool.get_or_init(|| pool).clone())
}

pub(super) async fn admit(
    app: &App,
    intake: &mut Intake,
    decided: &Decided,
    ctx: &Ctx,
    ex: &mut Exchange,
) -> Result<Admitted, GateError> {
    // The deadline runs from arrival: time spent queued and time spent waiting for a down upstream
    // share the one budget the client was promised. A preflight is answered at once: by
    // llama-server, or for it when it cannot (no retries).
    let deadline = match ctx.preflight {
        true => Instant::now(),
        false => ctx.arrived + app.config.queue_timeout,
    };
    let decision = decided.decision.as_ref();
    if !ctx.slot_route {
        let claim = Claim::new(&intake.summary, decision, decided.priority, 0);
        ex.set_tenant(claim.tenant);
        // In front of a router, one that names a model (`/props?model=`, `/tokenize`) waits for
        // slotgate to load it rather than have the router load it, and evict, on its own.
        let pool = match ctx.preflight {
            true => None,
            false => {
                known_model(app, intake).await?;
                model_pool(app, intake)
            }
        };
        let mut waited = Duration::ZERO;
        if let Some(p) = &pool {
            ex.set_model(&p.id);
            p.arrive()?;
            let started = Instant::now();
            app.models
                .wait_loaded(p, ctx.arrived + p.queue_timeout)
                .await?;
            waited = started.elapsed();
        }
        ex.set_queue_wait(waited);
        ex.live().admitted(0);
        return Ok(Admitted {
            slot: None,
            queue_wait: waited,
            deadline,
            no_autoload: pool.is_some(),
        });
    }
    // Before the router: a model it does not serve is refused at once, not after a wait.
    known_model(app, intake).await?;
    // Its model's own pool, queue and queue timeout; one whose last load failed is refused at once
    // while that backs off.
    let pool = model_pool(app, intake);
    let (admission, deadline) = match &pool {
        Some(p) => {
            ex.set_model(&p.id);
            p.arrive()?;
            let deadline = match ctx.preflight {
                true => deadline,
                false => ctx.arrived + p.queue_timeout,
            };
            (&p.admission, deadline)
        }
        None => (&app.admission, deadline),
    };
    // Its own deadline, when shorter than the queue timeout: it must start by then, or leave
    // the queue without reaching llama-server.
    let own = decided
        .deadline
        .map(|d| ctx.arrived + d)
        .filter(|d| *d < deadline && !ctx.preflight);
    if let Some(d) = own {
        ex.set_deadline(d - ctx.arrived);
    }
    let deadline = own.unwrap_or(deadline);
    // Again, after any policy capped max_tokens: what the scheduler charges up front and holds
    // (slots, pool tokens), and what `slotgate_tokens_reserved_total` counts.
    let demand = demand_of(app, intake)?;
    let claim = Claim::new(&intake.summary, decision, decided.priority, demand.charge);
    let cap = tenant_cap(app, &claim.tenant);
    let claim = claim
        .capped(cap)
        .holding(demand.slots, demand.kv)
        .tagged(ex.live().key)
        .due(own)
        .keeping_slot(intake.names_conversation())
        .with_body(intake.body.clone());
    ex.set_tenant(claim.tenant.clone());
    if let Some(band) = admission.band_of(claim.priority) {
        ex.set_band(band);
    }
    let queue = crate::otel::phase(ex.span(), "queue");
    let (slot, queue_wait, demand) = match admission.enter(claim, deadline)? {
        Entry::Admitted(slot) => {
            if intake.prompt_counts.is_none() {
                let s = &intake.summary;
                tokenize::record(tokenize::Source::Forwarded, s.prompt_tokens_estimate, None);
            }
            (slot, Duration::ZERO, demand)
        }
        // Boxed: a wait's state (the queue ticket, the count under way) is large and a request
        // that gets a slot at once never needs it, while every request's future is moved whole.
        Entry::Queued(ticket) => {
            ex.live().set_phase(Phase::Queued);
            if let Some(p) = &pool {
                app.models.ensure_loaded(p);
            }
            Box::pin(wait_for_slot(
                app, intake, ticket, decision, demand, deadline, &queue,
            ))
            .await?
        }
    };
    drop(queue);
    ex.live().admitted(demand.slots);
    ex.set_reserved(demand.reserved.unwrap_or(demand.charge));
    ex.set_prompt_tokens(intake.summary.prompt_tokens_best());
    ex.set_queue_wait(queue_wait);
    Ok(Admitted {
        slot: Some(slot),
        queue_wait,
        deadline,
        no_autoload: pool.is_some(),
    })
}

/// The operator's caps on `tenant` (its `[tenants."NAME"]` table, else the defaults); the claim
/// keeps the stricter of these and its policies'.
fn tenant_cap(app: &App, tenant: &str) -> TenantCap {
    let t = app.config.tenant_caps.of(tenant);
    let as_usize = |n: Option<u32>| n.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    TenantCap {
        in_service: as_usize(t.max_in_service),
        waiting: as_usize(t.max_waiting),
    }
}

/// A slot for the queued request. (Free, with nobody waiting, it had one at once, charged on the
/// estimate: the slot settles from llama-server's usage.) Its prompt is counted while it
/// waits (unless the chain had it counted already): its place is then re-costed, so the fair-share
/// charge at admission, what it holds of the pool and the wait estimates (Retry-After, doomed
/// waits) of those behind it are exact, and a prompt that cannot fit a slot leaves the queue with
/// 400 instead of reaching llama-server. A slot granted before the count is back is taken at once,
/// on the estimate.
async fn wait_for_slot(
    app: &App,
    intake: &mut Intake,
    mut ticket: Ticket,
    decided: Option<&Decision>,
    demand: Demand,
    deadline: Instant,
    span: &tracing::Span,
) -> Result<(SlotGuard, Duration, Demand), GateError> {
    let counted = intake.prompt_counts.is_some();
    let forwarded = |s: &RequestSummary| {
        if !counted {
            tokenize::record(tokenize::Source::Forwarded, s.prompt_tokens_estimate, None);
        }
    };
    let mut demand = demand;
    if !counted {
        tokio::select! {
            biased;
            granted = ticket.wait(deadline) => {
                if granted.is_ok() {
                    forwarded(&intake.summary);
                }
                return granted.map(|(slot, wait)| (slot, wait, demand));
            }
            done = async {
                let _phase = crate::otel::phase(span, "count");
                count_prompt(app, intake, Before::Slot).await
            } => demand = done?,
        }
        if intake.prompt_counts.is_some() {
            ticket.recost(
                Claim::cost_of(decided, demand.charge),
                demand.slots,
                demand.kv,
            );
        }
    }
    ticket
        .wait(deadline)
        .await
        .map(|(slot, wait)| (slot, wait, demand))
}

/// In front of llama-server's router, a request must name a model it serves (an id or an alias of
/// its `/models`): otherwise 404 `model_not_found` at once. A name it does not list has the list read
/// again first (a model added since). Without a name, or before the list is read, the router decides.
async fn known_model(app: &App, intake: &Intake) -> Result<(), GateError> {
    let router = &app.capacity.router;
    let Some(model) = intake.summary.model.as_deref().filter(|_| router.is_on()) else {
        return Ok(());
    };
    if let Known::No(_) = router.knows(model) {
        router.refresh(&app.upstream).await;
    }
    match router.knows(model) {
        Known::No(known) => Err(GateError::ModelNotFound {
            model: model.to_owned(),
            known,
        }),
        Known::Yes | Known::Unknown => Ok(()),
    }
}
