//! The admit phase: what a slot request holds (slots, KV pool tokens), its claim (tenant, cost,
//! weight, priority), and a slot: at once when one is free and nobody waits, else in its fair place
//! in the queue, or a 429/504.

use std::sync::Arc;
use std::time::Duration;

use slotgate_sdk::{Decision, RequestSummary};
use tokio::time::Instant;

use crate::admission::{Admission, Claim, Demand, Entry, SlotGuard, TenantCap, Ticket};
use crate::error::GateError;
use crate::live::Phase;
use crate::router::Known;
use crate::router::Pool;
use crate::state::App;
use crate::upstream::quarantine::ABANDON_GRACE;
use crate::upstream::tokenize;

use super::access::Exchange;
use super::count::{count_prompt, demand_of, Before};
use super::decide::Decided;
use super::intake::Intake;
use super::routes;
use super::waiting::{Queued, Signal};
use super::{Ctx, Shed};

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

pub(super) async fn admit(
    app: &App,
    intake: &mut Intake,
    decided: &Decided,
    ctx: &Ctx,
    ex: &mut Exchange,
) -> Result<Admitted, GateError> {
    match ctx.slot_route {
        true => admit_to_slot(app, intake, decided, ctx, ex).await,
        false => admit_without_slot(app, intake, decided, ctx, ex).await,
    }
}

/// By when it must have been sent: its queue timeout from arrival (time spent queued and time
/// spent waiting for a down upstream share the one budget the client was promised). A preflight is
/// answered at once: by llama-server, or for it when it cannot (no retries).
fn queue_deadline(app: &App, intake: &Intake, ctx: &Ctx) -> Instant {
    match ctx.preflight {
        true => Instant::now(),
        false => ctx.arrived + intake.queue_timeout(app),
    }
}

/// A request that takes no slot: counted for its tenant, and in front of a router, one that names a
/// model (`/props?model=`, `/tokenize`) waits for slotgate to load it rather than have the router
/// load it, and evict, on its own.
async fn admit_without_slot(
    app: &App,
    intake: &mut Intake,
    decided: &Decided,
    ctx: &Ctx,
    ex: &mut Exchange,
) -> Result<Admitted, GateError> {
    let claim = Claim::new(
        &intake.summary,
        decided.decision.as_ref(),
        decided.priority,
        0,
    );
    ex.set_tenant(claim.tenant);
    // The router's own model routes (`/models/load`, ...) name the model they act on: they are
    // forwarded as they came, never held for a load.
    let pool = match ctx.preflight
        || routes::manages_models(&intake.parts.method, intake.parts.uri.path())
    {
        true => None,
        false => {
            known_model(app, intake).await?;
            intake.model_pool(app)
        }
    };
    let deadline = queue_deadline(app, intake, ctx);
    let mut waited = Duration::ZERO;
    if let Some(p) = &pool {
        ex.set_model(&p.id);
        p.arrive()?;
        may_load(app, intake, p).await?;
        let started = Instant::now();
        app.models.wait_loaded(p, deadline).await?;
        waited = started.elapsed();
    }
    ex.set_queue_wait(waited);
    ex.live().admitted(0);
    Ok(Admitted {
        slot: None,
        queue_wait: waited,
        deadline,
        no_autoload: pool.is_some(),
    })
}

/// A slot route's request: what it holds and its claim, then a slot at once or its place in the
/// queue (its model's own, in front of a router).
async fn admit_to_slot(
    app: &App,
    intake: &mut Intake,
    decided: &Decided,
    ctx: &Ctx,
    ex: &mut Exchange,
) -> Result<Admitted, GateError> {
    // Before the router: a model it does not serve is refused at once, not after a wait.
    known_model(app, intake).await?;
    // Its model's own pool and queue; one whose last load failed is refused at once while that
    // backs off.
    let pool = intake.model_pool(app);
    if let Some(p) = &pool {
        ex.set_model(&p.id);
        p.arrive()?;
        may_load(app, intake, p).await?;
    }
    let admission = pool.as_ref().map_or(&app.admission, |p| &p.admission);
    let deadline = queue_deadline(app, intake, ctx);
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
    let (claim, demand) = claim_of(app, intake, decided, own, ctx.named.as_ref(), ex)?;
    if let Some(band) = admission.band_of(claim.priority) {
        ex.set_band(band);
    }
    let place = Place {
        admission,
        pool: pool.as_ref(),
        deadline,
        waiting: ctx.waiting.as_deref(),
    };
    let (slot, queue_wait, demand) =
        take_place(app, intake, decided, claim, demand, place, ex).await?;
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

/// Where a slot request waits: the queue (the gate's, or its model's in front of a router) and
/// its deadline.
struct Place<'a> {
    admission: &'a Admission,
    pool: Option<&'a Arc<Pool>>,
    deadline: Instant,
    /// Told when a stream joins the queue, for its answer to begin early (see `waiting`).
    waiting: Option<&'a Signal>,
}

/// A slot at once, or the request's place in the queue until one is granted (or it times out).
async fn take_place(
    app: &App,
    intake: &mut Intake,
    decided: &Decided,
    claim: Claim,
    demand: Demand,
    place: Place<'_>,
    ex: &mut Exchange,
) -> Result<(SlotGuard, Duration, Demand), GateError> {
    let Place {
        admission,
        pool,
        deadline,
        waiting,
    } = place;
    let queue = crate::otel::phase(ex.span(), "queue");
    let decision = decided.decision.as_ref();
    Ok(match admission.enter(claim, deadline)? {
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
            if let Some(signal) = waiting.filter(|_| intake.ask.stream) {
                signal.queued(Queued {
                    tag: ex.live().key,
                    pool: pool.cloned(),
                    dialect: intake.dialect,
                });
            }
            if let Some(p) = pool {
                app.models.ensure_loaded(p);
            }
            Box::pin(wait_for_slot(
                app, intake, ticket, decision, demand, deadline, &queue,
            ))
            .await?
        }
    })
}

/// What the request holds and claims. Worked out again after any policy capped max_tokens: what
/// the scheduler charges up front and holds (slots, pool tokens), and what
/// `slotgate_tokens_reserved_total` counts.
fn claim_of(
    app: &App,
    intake: &mut Intake,
    decided: &Decided,
    own: Option<Instant>,
    named: Option<&super::caller::Named>,
    ex: &mut Exchange,
) -> Result<(Claim, Demand), GateError> {
    let key_cap = named.and_then(|n| n.key.as_ref()?.record.max_in_service);
    let demand = demand_of(app, intake)?;
    let decision = decided.decision.as_ref();
    let claim = Claim::new(&intake.summary, decision, decided.priority, demand.charge);
    let mut cap = tenant_cap(app, &claim.tenant);
    // A key's own cap (`key create --max-in-service`), on its tenant's requests, the stricter.
    if let Some(n) = key_cap {
        cap.in_service = Some(cap.in_service.map_or(n, |c| c.min(n)));
    }
    // Its team's cap (`[teams."NAME"]`), for a caller a key named into a capped team.
    let team = named.and_then(|n| n.team()).and_then(|t| {
        let n = app.config.tenant_caps.of_team(t)?;
        Some((Arc::<str>::from(t), n))
    });
    let claim = claim
        .capped(cap)
        .team_capped(team)
        .holding(demand.slots, demand.kv)
        .tagged(ex.live().key)
        .due(own)
        .keeping_slot(intake.names_conversation())
        .with_body(intake.body.clone());
    ex.set_tenant(claim.tenant.clone());
    Ok((claim, demand))
}

/// A request told to yield its slot before its answer began (it is sheddable, and a more urgent
/// one needed the slot): back to its place in the queue, unanswered, with a new queue timeout
/// from now; then it is forwarded again, whole. A slot that could not be given up (nobody took
/// it) is kept, and the request forwarded again at once.
pub(super) async fn again(
    app: &App,
    intake: &Intake,
    shed: Shed,
    ex: &mut Exchange,
) -> Result<Admitted, GateError> {
    let Shed { slot, admitted } = shed;
    let mut ticket = match slot.requeue(ABANDON_GRACE) {
        Ok(ticket) => ticket,
        Err(kept) => {
            return Ok(Admitted {
                slot: Some(*kept),
                ..admitted
            })
        }
    };
    ex.shed();
    let deadline = Instant::now() + intake.queue_timeout(app);
    tracing::debug!(request_id = %ex.request_id(), "shed before its first byte: queued again");
    let (slot, waited) = ticket.wait(deadline).await?;
    let queue_wait = admitted.queue_wait + waited;
    ex.set_total_queue_wait(queue_wait);
    ex.live().readmitted();
    Ok(Admitted {
        slot: Some(slot),
        queue_wait,
        deadline,
        ..admitted
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
            // Boxed: the count's state is only needed while it runs, not for the rest of the wait.
            done = Box::pin(async {
                let _phase = crate::otel::phase(span, "count");
                count_prompt(app, intake, Before::Slot).await
            }) => demand = done?,
        }
        if intake.prompt_counts.is_some() {
            ticket.recost(
                Claim::cost_of(decided, demand.charge),
                demand.slots,
                demand.kv,
            );
        }
    }
    // Counted (or never to be): nothing reads the parsed body until the slot is granted, so a
    // waiting request keeps only its bytes, and the tree is parsed again once it has its slot
    // (one refused meanwhile never needs it).
    let parked = intake.park_tree();
    let (slot, wait) = ticket.wait(deadline).await?;
    if parked {
        intake.unpark_tree()?;
    }
    Ok((slot, wait, demand))
}

/// Before slotgate loads a model for a request (in front of a router, its model not loaded): the
/// router would refuse the request before any load when it loads models only when asked
/// (`--no-models-autoload`, or the request's own `?autoload=false`: 400 "model is not loaded") or
/// when the request's credentials are not llama-server's (401 "Invalid API Key"). So does
/// slotgate, in the router's words, rather than load a model for it.
async fn may_load(app: &App, intake: &Intake, pool: &Pool) -> Result<(), GateError> {
    if !pool.admission.is_paused() {
        return Ok(());
    }
    let asked = intake.parts.uri.query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "autoload")
            .map(|(_, v)| v == "true" || v == "1")
    });
    let router = &app.capacity.router;
    if !router.autoloads(asked) {
        // Loaded since the last health check by a client's own `/models/load`: the router's list
        // says so at once.
        router.refresh(&app.upstream).await;
        app.models.follow();
        return match pool.admission.is_paused() {
            true => Err(GateError::ModelNotLoaded),
            false => Ok(()),
        };
    }
    // The router checks a key on every route but `/health`: a cheap route, with the client's own
    // credentials only, says whether it would take this request.
    if app.upstream.has_key() {
        let mut credentials = http::HeaderMap::new();
        for name in [
            http::header::AUTHORIZATION,
            http::HeaderName::from_static("x-api-key"),
        ] {
            if let Some(v) = intake.parts.headers.get(&name) {
                credentials.insert(name, v.clone());
            }
        }
        let probe = app
            .upstream
            .send(
                &http::Method::GET,
                "/models",
                &credentials,
                bytes::Bytes::new(),
                false,
            )
            .await;
        if probe.is_ok_and(|r| r.status() == http::StatusCode::UNAUTHORIZED) {
            return Err(GateError::InvalidApiKey);
        }
    }
    Ok(())
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
