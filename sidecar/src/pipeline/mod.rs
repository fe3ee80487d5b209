//! THE request path: one phase per file, in call order.
//!
//! ```text
//! routes   which route is what: slot in a dialect | passthrough | health | admin | host
//! intake   the bounded body, read as JSON in its dialect (json_edit keeps the client's bytes)
//! count    llama-server's exact prompt count, before the chain when a policy asks for it
//! decide   the policy chain (wasm on a fiber): allow with changes, deny, or fail
//! admit    what it holds (slots, KV pool), its claim (tenant, cost, priority), a slot or the queue;
//!          a request shed before its answer began goes back to the queue (`admit::again`)
//! forward  to llama-server, retried only while nothing was sent
//! body     streams the answer holding the slot; settles usage, slot and record at its end
//! reply    the upstream's answer with slotgate's headers (its body in `body`), or slotgate's own
//!          refusal
//!
//! beside them, for every phase:
//! access   the one record per request (metrics, access log, the policies' on_complete)
//! strip    takes out of a stream the usage slotgate asked for and the client did not
//! request_id  the id every request carries
//! ```
//!
//! The exact prompt count (llama-server's count endpoints and `/tokenize`, see
//! `upstream::tokenize`) stays off the path of a request that gets a slot at once: it is forwarded
//! on the estimate and settled from the usage llama-server reports. A request that has to wait is
//! counted while it waits, and its place in the queue is re-costed. Only a chain with a policy that
//! asks for the count (`needs_prompt_tokens`) has every request counted before the chain runs.
//!
//! Each phase hands the request on or ends it with a `GateError`, which `reply` turns into the
//! client's one response. A phase names only the phases before it (what they handed on), never a
//! later one: what a later phase needs is worked out early and carried (the model's pool, looked up
//! once in `Intake`), and the loop of a shed request (forward, back to the queue, forward again)
//! runs here, in `phases`. `arrows.rs` (`phases_run_one_way`) holds this.

pub mod access;
mod admit;
pub mod body;
pub mod caller;
pub mod conversation;
mod count;
mod decide;
mod forward;
pub mod intake;
pub mod lineage;
pub mod loads;
pub mod me;
pub mod orca;
mod reply;
pub mod request_id;
pub mod routes;
pub mod strip;
pub mod waiting;

use std::sync::Arc;

use http::Request;
use hyper::body::Incoming;
use slotgate_sdk::Peer;
use tokio::time::Instant;

use crate::admission::SlotGuard;
use crate::error::GateError;
use crate::live::Phase;
use crate::respond::Body;
use crate::server::conn::ClientAddr;
use crate::state::App;
use access::Exchange;
use forward::Attempt;
use reply::{Answer, Refusal, Reply};
use routes::Handling;

/// Response header with the time the request waited for a slot.
pub const QUEUE_WAIT_HEADER: &str = "x-slotgate-queue-wait-ms";
/// Response header on every refusal slotgate makes itself: its outcome (`queue_full`,
/// `policy_denied`, ...; docs/http-api.md), the same label as the access line's and the metrics'.
pub const REASON_HEADER: http::HeaderName = http::HeaderName::from_static("x-slotgate-reason");
/// Request header with the client's own deadline: milliseconds from arrival within which the request
/// must start, else it leaves the queue (504 `deadline_exceeded`) or is refused at arrival when it
/// cannot make it (429 `deadline_unreachable`). Capped by the queue timeout (docs/scheduling.md).
pub const DEADLINE_HEADER: http::HeaderName =
    http::HeaderName::from_static("x-slotgate-deadline-ms");
/// Response header with the exact prompt tokens slotgate counted before admission, when it could.
pub const PROMPT_TOKENS_HEADER: &str = "x-slotgate-prompt-tokens";

/// What every phase may ask of the request.
struct Ctx {
    arrived: Instant,
    /// It takes a slot (a generation, embedding or rerank route in its dialect).
    slot_route: bool,
    /// A CORS preflight: it carries no credentials and does nothing, so no policy judges it and
    /// it is answered at once.
    preflight: bool,
    /// Told when a streaming request joins a queue, for its answer to begin early (see
    /// `waiting`).
    waiting: Option<Arc<waiting::Signal>>,
    /// Who is asking (see `caller`): who may read or stop the conversations it starts.
    caller: crate::admission::Caller,
    /// Who slotgate says it is, under `--client-auth keys`.
    named: Option<caller::Named>,
}

impl Ctx {
    fn of(
        req: &Request<Incoming>,
        found: &Result<Handling, GateError>,
        arrived: Instant,
        waiting: Option<Arc<waiting::Signal>>,
    ) -> Ctx {
        Ctx {
            arrived,
            slot_route: matches!(found, Ok(Handling::Slot(_))),
            preflight: req.method() == http::Method::OPTIONS,
            waiting,
            caller: crate::admission::Caller::Anyone,
            named: None,
        }
    }
}

pub async fn handle(app: Arc<App>, mut req: Request<Incoming>, peer: Option<Peer>) -> Response {
    let arrived = Instant::now();
    let id = request_id::assign(req.headers_mut());
    let found = routes::find(req.method(), req.uri().path());
    let reply = Reply::to(&app, &req, &found);
    // `/health` is answered from slotgate's own readiness, unlogged as llama-server leaves it.
    // Its load, for a router polling it (`loads`): as unlogged, to a caller llama-server accepts.
    let mut resp = if let Ok(Handling::Health) = found {
        reply.health()
    } else if let Ok(Handling::Loads) = found {
        reply.loads(req.headers(), client_ip(&req)).await
    } else if let Ok(Handling::Me) = found {
        reply.me(req.headers(), peer, client_ip(&req)).await
    } else {
        let addr = req.extensions().get::<ClientAddr>().map(|a| a.0);
        let span = crate::otel::request(req.method(), req.uri().path(), req.headers());
        let mut ex = Exchange::new(
            &app.live,
            &app.ledger,
            req.method(),
            req.uri().path(),
            peer,
            addr,
            &id,
            span,
        );
        let keep_alive = match found {
            Ok(Handling::Slot(_)) => waiting::interval(app.config.stream_keepalive, req.headers()),
            _ => None,
        };
        let conversation = matches!(found, Ok(Handling::Slot(_)))
            && lineage::conversation(req.headers()).is_some();
        match keep_alive {
            Some(every) => {
                let kept = conversation;
                kept_alive(&app, req, peer, found, arrived, ex, every, kept).await
            }
            None if conversation => detached(&app, req, peer, found, arrived, ex).await,
            None => match phases(&app, req, peer, found, arrived, None, &mut ex).await {
                Ok(answer) => reply.answer(ex, answer),
                Err(refusal) => reply.refuse(ex, refusal),
            },
        }
    };
    resp.headers_mut().insert(request_id::REQUEST_ID, id);
    resp
}

type Response = http::Response<Body>;

/// A slot route's request whose stream, if it has to wait, is kept alive (see `waiting`): its
/// phases run as a task of their own, and its answer begins as soon as it joins a queue, or is
/// its own answer when it never waits. One naming a conversation is `kept` when its client
/// leaves, as [`detached`] keeps it.
#[allow(
    clippy::too_many_arguments,
    reason = "the request's phases' own, and how it is kept alive"
)]
async fn kept_alive(
    app: &Arc<App>,
    req: Request<Incoming>,
    peer: Option<Peer>,
    found: Result<Handling, GateError>,
    arrived: Instant,
    ex: Exchange,
    every: std::time::Duration,
    kept: bool,
) -> Response {
    let origin = req.headers().get(http::header::ORIGIN).cloned();
    let (signal, queued) = waiting::Signal::new();
    let signal = Some(Arc::new(signal));
    let mut task = waiting::Phases {
        task: spawn_phases(app, req, peer, found, arrived, ex, signal),
        kept,
    };
    tokio::select! {
        biased;
        done = &mut task.task => done.unwrap_or_else(|_| crate::respond::task_failed(None)),
        Ok(queued) = queued => {
            let mut resp = waiting::early(app.clone(), task, queued, every);
            app.cors.apply(origin.as_ref(), resp.headers_mut());
            resp
        }
    }
}

/// A slot route's request naming a conversation: its phases run as a task of their own, which
/// its client leaving does not end (dropping the handle detaches it). llama-server keeps such a
/// request when its client goes, and generates its answer into the conversation's session for a
/// later resume; one waiting here must reach it all the same.
async fn detached(
    app: &Arc<App>,
    req: Request<Incoming>,
    peer: Option<Peer>,
    found: Result<Handling, GateError>,
    arrived: Instant,
    ex: Exchange,
) -> Response {
    spawn_phases(app, req, peer, found, arrived, ex, None)
        .await
        .unwrap_or_else(|_| crate::respond::task_failed(None))
}

/// The request's phases and its reply, as a task of their own.
fn spawn_phases(
    app: &Arc<App>,
    req: Request<Incoming>,
    peer: Option<Peer>,
    found: Result<Handling, GateError>,
    arrived: Instant,
    ex: Exchange,
    waiting: Option<Arc<waiting::Signal>>,
) -> tokio::task::JoinHandle<Response> {
    let app = app.clone();
    tokio::spawn(async move {
        let mut ex = ex;
        let reply = Reply::to(&app, &req, &found);
        match phases(&app, req, peer, found, arrived, waiting, &mut ex).await {
            Ok(answer) => reply.answer(ex, answer),
            Err(refusal) => reply.refuse(ex, refusal),
        }
    })
}

/// The request path, phase by phase.
async fn phases(
    app: &Arc<App>,
    mut req: Request<Incoming>,
    peer: Option<Peer>,
    found: Result<Handling, GateError>,
    arrived: Instant,
    waiting: Option<Arc<waiting::Signal>>,
    ex: &mut Exchange,
) -> Result<Answer, Refusal> {
    let mut ctx = Ctx::of(&req, &found, arrived, waiting);
    let handling = routes::allowed(found, req.method(), req.uri().path(), &app.config)
        .map_err(Refusal::body_unread)?;
    (ctx.caller, ctx.named) = who(app, &req, peer, &ctx)
        .await
        .map_err(Refusal::body_unread)?;
    conversation::stream_route(app, &mut req, ctx.caller).map_err(Refusal::body_unread)?;
    // `debug` logging: a line per phase passed, each with the request's id (its end is the access
    // line). Off, each costs a level check.
    let id = match tracing::enabled!(tracing::Level::DEBUG) {
        true => ex.request_id(),
        false => String::new(),
    };
    tracing::debug!(request_id = %id, route = handling.label(), "routes: found");
    let phase = crate::otel::phase(ex.span(), "intake");
    let mut intake = intake::read(req, &app.limits, peer, handling)
        .await
        .map_err(Refusal::reading)?;
    intake
        .take_hints(
            &app.config.service_tier_priority,
            app.config.slo_ttft_deadline,
        )
        .map_err(Refusal::reading)?;
    conversation::lookup(app, &mut intake, ctx.caller);
    if let Some(named) = &ctx.named {
        if let Some(id) = named.key_id() {
            ex.set_key(named.team(), id);
        }
        intake
            .named(named, app.capacity.served_model().as_deref(), &app.upstream)
            .map_err(Refusal::reading)?;
    }
    drop(phase);
    traced_ask(ex, &intake);
    tracing::debug!(request_id = %id, bytes = intake.body.len(), stream = intake.ask.stream, max_tokens = ?intake.ask.max_tokens, "intake: body read");
    let decided = judge(app, &mut intake, &ctx, ex).await?;
    tracing::debug!(request_id = %id, priority = decided.priority, "decide: allowed");
    let refused = |e: GateError| Refusal::after_policies(e, &decided.response_headers);
    let mut admitted = conversation::admit(app, &mut intake, &decided, &ctx, ex)
        .await
        .map_err(refused)?;
    tracing::debug!(request_id = %id, queue_wait_ms = admitted.queue_wait.as_millis() as u64, slot = admitted.slot.is_some(), "admit: admitted");
    let mut going = forward::begin(app, &mut intake, &ctx, ex).map_err(refused)?;
    // Forwarded until an answer begins; a sheddable request told to yield its slot first goes
    // back to the queue, and then again to llama-server, whole.
    let sent = loop {
        // Boxed: a future takes the room of its largest state, and this was it, so every request
        // (one waiting in the queue too) held room for an upstream exchange not yet begun.
        match Box::pin(forward::attempt(app, &intake, going, admitted, ex)).await {
            Ok(Attempt::Answered(sent)) => break Ok(sent),
            Ok(Attempt::Shed(again, shed)) => {
                going = again;
                admitted = admit::again(app, &intake, shed, ex)
                    .await
                    .map_err(refused)?;
            }
            Err(e) => break Err(e),
        }
    };
    let sent = match sent {
        Ok(sent) => sent,
        // llama-server answers every preflight; while it cannot, slotgate answers as it would.
        Err(_) if ctx.preflight => return Ok(Answer::Preflight),
        Err(e) => return Err(refused(e)),
    };
    tracing::debug!(request_id = %id, status = sent.response.status().as_u16(), "forward: answer begun");
    Ok(Answer::Upstream {
        sent,
        intake,
        headers: decided.response_headers,
        slot_route: ctx.slot_route,
    })
}

/// The TCP peer's address of `req` (none on a Unix socket).
fn client_ip<B>(req: &Request<B>) -> Option<std::net::IpAddr> {
    req.extensions().get::<ClientAddr>().map(|a| a.0.ip())
}

/// Who is asking: the request's one credential, read as llama-server reads it (400 when it could be
/// read two ways), then let in by `--client-auth` before anything is charged (see `caller`): a key
/// slotgate issued (`keys`, which also names the caller), what llama-server would take
/// (`upstream`), or anyone (`open`). A preflight carries no credentials, and llama-server asks for
/// none.
async fn who(
    app: &App,
    req: &Request<Incoming>,
    peer: Option<Peer>,
    ctx: &Ctx,
) -> Result<(crate::admission::Caller, Option<caller::Named>), GateError> {
    let addr = client_ip(req);
    caller::held(let_in(app, req, peer, addr, ctx).await, addr, peer).await
}

/// [`who`], before a refusal is held back.
async fn let_in(
    app: &App,
    req: &Request<Incoming>,
    peer: Option<Peer>,
    addr: Option<std::net::IpAddr>,
    ctx: &Ctx,
) -> Result<(crate::admission::Caller, Option<caller::Named>), GateError> {
    // Where it comes from, before anything else (`--allow-from`).
    caller::check_source(&app.config.allow_from, addr)?;
    let credential = caller::credential(req.headers())
        .inspect_err(|_| crate::metrics::caller_refused("ambiguous"))?;
    // The key is hashed once, for the verdict and for the caller both.
    let digest = credential.as_ref().map(caller::Credential::digest);
    let named = match ctx.preflight {
        true => None,
        false => caller::let_in(app, credential.as_ref(), digest, peer, addr).await?,
    };
    Ok((crate::admission::Caller::of(digest, peer), named))
}

/// The count the chain may need, then the chain's decision, under one chain version: it decides
/// this request and hears how it ended, whatever reloads meanwhile.
async fn judge(
    app: &Arc<App>,
    intake: &mut intake::Intake,
    ctx: &Ctx,
    ex: &mut Exchange,
) -> Result<decide::Decided, Refusal> {
    ex.live().set_stream(intake.ask.stream);
    ex.live().set_phase(Phase::Deciding);
    let chain = app.policies.current();
    let decided = match count::before_chain(app, intake, &chain, ctx, ex.span()).await {
        Ok(()) => {
            let _phase = crate::otel::phase(ex.span(), "policy");
            decide::decide(app, intake, chain, ctx, ex).await
        }
        Err(e) => Err(e),
    };
    let decided = decided.inspect_err(|_| {
        // Refused before the scheduler named a tenant: counted for the caller.
        ex.set_tenant(std::sync::Arc::from(intake.summary.identity().to_string()));
    })?;
    ex.set_priority(decided.priority);
    Ok(decided)
}

/// A request told to yield its slot before its answer began (see `forward::attempt`): the slot it
/// held and what admission gave it, for `admit::again` to put it back in the queue.
struct Shed {
    slot: SlotGuard,
    admitted: admit::Admitted,
}

/// What the request asks: its lineage on the record, and on its trace's server span the GenAI
/// operation, model and max tokens.
fn traced_ask(ex: &mut Exchange, intake: &intake::Intake) {
    let s = &intake.summary;
    let id = |id: &Option<String>| id.as_deref().map(Box::from);
    ex.live().set_lineage(crate::live::Lineage {
        session: id(&s.session_id),
        agent: id(&s.agent_id),
        parent: id(&s.parent_agent_id),
        conversation: id(&s.conversation_id),
    });
    let span = ex.span();
    if span.is_disabled() {
        return;
    }
    if let Some(dialect) = intake.dialect {
        span.record(
            "gen_ai.operation.name",
            crate::otel::operation(dialect.name()),
        );
        span.record("gen_ai.provider.name", "llama.cpp");
    }
    if let Some(model) = &intake.summary.model {
        span.record("gen_ai.request.model", model.as_str());
    }
    if let Some(max) = intake.ask.max_tokens {
        span.record("gen_ai.request.max_tokens", max as i64);
    }
}
