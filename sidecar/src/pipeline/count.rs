//! The count phase: the prompt's exact tokens, from llama-server's own endpoints (see
//! `upstream::tokenize`), and what the request then holds (`admission::demand`). Before the chain
//! only when a policy asks for the count (or `--count-first`); otherwise while the request waits for
//! a slot (see `admit`), and not at all for one that gets a slot at once.

use crate::admission::{Demand, Want};
use crate::config::Slots;
use crate::error::GateError;
use crate::policy::Chain;
use crate::state::App;
use crate::upstream::tokenize;

use super::intake::Intake;
use super::Ctx;

/// When a prompt is counted.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Before {
    /// Before the chain runs, because a policy asked for the count.
    Chain,
    /// While the request waits in the queue.
    Slot,
}

/// Counts a slot request's prompt before the chain, when a policy or `--count-first` asks.
pub(super) async fn before_chain(
    app: &App,
    intake: &mut Intake,
    chain: &Chain,
    ctx: &Ctx,
    span: &tracing::Span,
) -> Result<(), GateError> {
    if ctx.slot_route && (app.config.count_first || chain.needs_prompt_tokens()) {
        let _phase = crate::otel::phase(span, "count");
        // Boxed: the count's state is large and most requests never have it, while every
        // request's future is moved whole (see `phases`).
        Box::pin(count_prompt(app, intake, Before::Chain)).await?;
    }
    Ok(())
}

/// Counts the prompt with llama-server's own endpoints (the estimate stands when it cannot) and
/// works out what the request holds. A prompt that exactly counted cannot fit a slot is refused
/// here, before it could take a slot.
pub(super) async fn count_prompt(
    app: &App,
    intake: &mut Intake,
    when: Before,
) -> Result<Demand, GateError> {
    // Before the chain, with every slot busy and the queue full, the request will most likely be
    // turned away: keep that 429 fast and do not ask llama-server (the estimate stands).
    let pool = intake.model_pool(app);
    let q = pool
        .as_ref()
        .map_or(&app.admission, |p| &p.admission)
        .stats();
    let full = when == Before::Chain && q.busy >= q.slots && q.depth >= q.capacity;
    let (exact, source) = match (&intake.json, intake.dialect) {
        // In front of a router, only a loaded model is asked (a count must never load one).
        (Some(json), Some(d))
            if !full && pool.as_ref().is_none_or(|p| !p.admission.is_paused()) =>
        {
            let model = pool.as_ref().map(|p| p.id.as_str());
            app.cost.prompt_tokens(d, json, &intake.body, model).await
        }
        _ => (None, tokenize::Source::Estimate),
    };
    let total = exact.as_ref().map(|c| c.iter().sum());
    tokenize::record(source, intake.summary.prompt_tokens_estimate, total);
    intake.summary.prompt_tokens = total;
    intake.prompt_counts = exact;
    demand_of(app, intake)
}

/// What a slot request holds while it runs (see `admission::demand`), with the counts it has
/// (exact or estimated) and the server as slotgate knows it now; the reservation goes into the
/// summary.
pub(super) fn demand_of(app: &App, intake: &mut Intake) -> Result<Demand, GateError> {
    let estimates: Vec<u64>;
    let (prompts, exact) = match &intake.prompt_counts {
        Some(counts) => (counts.as_slice(), true),
        None => {
            estimates = intake.ask.prompts.iter().map(|c| c.div_ceil(4)).collect();
            (estimates.as_slice(), false)
        }
    };
    let want = Want {
        prompts,
        exact,
        completions: intake.ask.completions,
        max_tokens: intake.ask.max_tokens,
        all_slots: intake.ask.all_slots,
    };
    // In front of a router, by the request's model (its context once it has been loaded).
    let demand = match intake.model_pool(app) {
        Some(pool) => {
            let ctx = pool.context();
            let slots = pool.admission.slots();
            crate::admission::demand(&want, slots, ctx.is_some(), ctx)?
        }
        None => {
            let (ctx, upstream_slots) = app.capacity.now();
            let slots_known =
                upstream_slots.is_some() || matches!(app.config.slots, Slots::Fixed(_));
            crate::admission::demand(&want, app.admission.slots(), slots_known, ctx)?
        }
    };
    intake.summary.reserved_tokens = demand.reserved;
    Ok(demand)
}
