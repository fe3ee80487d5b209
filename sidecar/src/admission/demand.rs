//! What a request holds while it runs: its slots and its share of the KV pool, within what
//! llama-server can hold (learnt by `upstream::capacity`), from its prompts' counts (exact or
//! estimated) and its output bounds.

use super::DEFAULT_MAX_TOKENS;
use crate::error::GateError;

/// What the upstream's slots can hold, for reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotContext {
    /// Tokens one slot may hold (`default_generation_settings.n_ctx`).
    pub n_ctx: u64,
    /// The server's default generation length, when it has one (`params.n_predict` > 0).
    pub default_n_predict: Option<u64>,
    /// Tokens all slots share, when they share one pool; `None`: each slot its own `n_ctx`.
    pub pool: Option<u64>,
}

/// What a request holds while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// Tokens reserved in all: each prompt plus the most each of its completions may generate
    /// within a slot's context. `None` while the slot context is unknown.
    pub reserved: Option<u64>,
    /// The up-front charge when no policy names one: `reserved`, else prompts plus `max_tokens`
    /// (or [`DEFAULT_MAX_TOKENS`]) per completion.
    pub charge: u64,
    /// Slots it runs on at once (llama-server runs a task per prompt and completion).
    pub slots: usize,
    /// Tokens of the KV pool it holds at once (the tasks that run together).
    pub kv: u64,
}

/// What a request asks, in tokens.
#[derive(Debug, Clone)]
pub struct Want<'a> {
    /// Prompt tokens of each prompt.
    pub prompts: &'a [u64],
    /// Whether they were counted exactly (an estimate is no ground to refuse).
    pub exact: bool,
    /// Completions of each prompt.
    pub completions: u64,
    /// The most tokens each completion may generate; `None`: the server's default.
    pub max_tokens: Option<u64>,
    /// llama-server spreads it over every slot.
    pub all_slots: bool,
}

/// What `want` holds on a server of `slots` slots (`slots_known` once llama-server said, or a fixed
/// `--slots`) whose slots hold `ctx`. Refuses what llama-server could never run: a prompt of a
/// slot's context or more (counted exactly), more completions at once than it has slots.
///
/// In a shared pool the completions of one prompt share its prompt's cells (llama-server copies the
/// sequence), so a prompt with `n` completions holds `prompt + n × output`; the tasks that run at
/// once hold the largest such groups that fit the slots; and no request is reserved more than the
/// pool (alone, it may use it all).
pub fn demand(
    want: &Want<'_>,
    slots: usize,
    slots_known: bool,
    ctx: Option<SlotContext>,
) -> Result<Demand, GateError> {
    let n = want.completions.max(1);
    let slots = slots.max(1);
    if slots_known && n > slots as u64 {
        return Err(GateError::TooManyCompletions {
            asked: n,
            slots: slots as u64,
        });
    }
    let prompts: &[u64] = if want.prompts.is_empty() {
        &[0]
    } else {
        want.prompts
    };
    let tasks = (prompts.len() as u64).saturating_mul(n);
    let width = match want.all_slots {
        true => slots,
        false => usize::try_from(tasks).unwrap_or(usize::MAX).min(slots),
    };
    // Each prompt with its completions: (tokens, slots).
    let mut groups: Vec<u64> = Vec::with_capacity(prompts.len());
    let mut reserved = ctx.map(|_| 0u64);
    let mut charge = 0u64;
    for &p in prompts {
        let group = match ctx {
            Some(c) => {
                if p >= c.n_ctx {
                    if want.exact {
                        return Err(GateError::ContextTooLong {
                            prompt: p,
                            n_ctx: c.n_ctx,
                        });
                    }
                    // An estimate: llama-server decides; reserve the whole slot.
                    c.n_ctx
                } else {
                    let room = c.n_ctx - p;
                    let output = want
                        .max_tokens
                        .or(c.default_n_predict)
                        .map_or(room, |m| m.min(room));
                    p.saturating_add(n.saturating_mul(output))
                }
            }
            None => {
                p.saturating_add(n.saturating_mul(want.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)))
            }
        };
        if let Some(r) = reserved.as_mut() {
            *r = r.saturating_add(group);
        }
        charge = charge.saturating_add(group);
        groups.push(group);
    }
    // The groups that run at once: the largest, until the slots are taken.
    groups.sort_unstable_by(|a, b| b.cmp(a));
    let per_group = usize::try_from(n).unwrap_or(usize::MAX).max(1);
    let running = width.div_ceil(per_group).max(1);
    let mut kv: u64 = groups.iter().take(running).sum();
    if let Some(pool) = ctx.and_then(|c| c.pool) {
        kv = kv.min(pool);
    }
    Ok(Demand {
        reserved,
        charge,
        slots: width.max(1),
        kv,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(n_ctx: u64, default: Option<u64>, pool: Option<u64>) -> Option<SlotContext> {
        Some(SlotContext {
            n_ctx,
            default_n_predict: default,
            pool,
        })
    }

    fn want(prompts: &[u64], completions: u64, max_tokens: Option<u64>) -> Want<'_> {
        Want {
            prompts,
            exact: true,
            completions,
            max_tokens,
            all_slots: false,
        }
    }

    fn reserved(w: &Want<'_>, c: Option<SlotContext>) -> Result<Option<u64>, u16> {
        demand(w, 4, true, c)
            .map(|d| d.reserved)
            .map_err(|e| e.status())
    }

    #[test]
    fn reservations_are_bounded_by_the_slot() {
        assert_eq!(
            reserved(&want(&[100], 1, Some(50)), ctx(1000, None, None)),
            Ok(Some(150))
        );
        // More than fits: only what the slot's context leaves.
        assert_eq!(
            reserved(&want(&[900], 1, Some(500)), ctx(1000, None, None)),
            Ok(Some(1000))
        );
        // No max_tokens: the server's default, else the rest of the context.
        assert_eq!(
            reserved(&want(&[100], 1, None), ctx(1000, Some(64), None)),
            Ok(Some(164))
        );
        assert_eq!(
            reserved(&want(&[100], 1, None), ctx(1000, None, None)),
            Ok(Some(1000))
        );
        // A prompt that cannot fit at all, counted; an estimate takes the slot instead.
        assert_eq!(
            reserved(&want(&[1000], 1, Some(1)), ctx(1000, None, None)),
            Err(400)
        );
        let estimate = Want {
            exact: false,
            ..want(&[1000], 1, Some(1))
        };
        assert_eq!(reserved(&estimate, ctx(1000, None, None)), Ok(Some(1000)));
        assert_eq!(reserved(&want(&[5], 1, Some(1)), None), Ok(None));
    }

    #[test]
    fn several_tasks_hold_several_slots_and_their_share_of_the_pool() {
        let pool = ctx(8192, None, Some(8192));
        // n: 2 completions share the prompt's cells.
        let d = demand(&want(&[100], 2, Some(50)), 4, true, pool).unwrap();
        assert_eq!((d.reserved, d.slots, d.kv), (Some(200), 2, 200));
        // Three prompts on two slots: the two largest run at once.
        let d = demand(&want(&[10, 300, 200], 1, Some(0)), 2, true, pool).unwrap();
        assert_eq!((d.reserved, d.slots, d.kv), (Some(510), 2, 500));
        // Unbounded on a shared pool: alone, it may use it all, never more.
        let d = demand(&want(&[100], 2, None), 4, true, pool).unwrap();
        assert_eq!((d.slots, d.kv), (2, 8192));
        // More completions than slots: llama-server refuses it; slotgate does first.
        let e = demand(&want(&[100], 3, Some(1)), 2, true, pool).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("3 completions"), "{e}");
        // ...but not before it knows how many slots there are.
        assert!(demand(&want(&[100], 3, Some(1)), 1, false, pool).is_ok());
        // Without a slot context, the charge is the estimate.
        let d = demand(&want(&[40, 60], 2, None), 4, true, None).unwrap();
        assert_eq!(
            (d.reserved, d.charge, d.slots),
            (None, 100 + 4 * DEFAULT_MAX_TOKENS, 4)
        );
    }
}
