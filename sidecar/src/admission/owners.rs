//! Who each conversation belongs to (`X-Conversation-Id`): the caller of the first request that
//! named it, the only one who may read, look up or stop it (see `pipeline::conversation`). Kept for
//! [`MAX_OWNED`] conversations, at most [`MAX_OWNED_PER_CALLER`] a caller, the oldest forgotten
//! and counted.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use slotgate_sdk::Peer;

/// Conversations whose caller is kept; past it the oldest are forgotten (and counted).
pub const MAX_OWNED: usize = 65_536;
/// Conversations one caller may hold of them; past it its oldest are forgotten.
pub const MAX_OWNED_PER_CALLER: usize = 4096;

/// Who a request comes from, for what only its own caller may do (read or stop its conversation):
/// its key, else on a Unix socket the peer's uid, else nobody in particular.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Caller {
    Key([u8; 32]),
    Uid(u32),
    Anyone,
}

impl Caller {
    /// The caller of a request with a key of this SHA-256 `digest`, or without one, from `peer`.
    pub fn of(digest: Option<[u8; 32]>, peer: Option<Peer>) -> Caller {
        match (digest, peer) {
            (Some(d), _) => Caller::Key(d),
            (None, Some(p)) => Caller::Uid(p.uid),
            (None, None) => Caller::Anyone,
        }
    }
}

/// Whose each conversation is: the caller of the first request that named it.
#[derive(Default)]
pub struct Owners {
    inner: Mutex<OwnersInner>,
}

#[derive(Default)]
struct OwnersInner {
    by_id: HashMap<Box<str>, Caller>,
    per_caller: HashMap<Caller, usize>,
    /// Ids in the order they were first named (an id forgotten since may still be here).
    order: VecDeque<Box<str>>,
}

impl Owners {
    /// Records `caller` as the owner of `conversation`, unless it already has one.
    pub fn claim(&self, conversation: &str, caller: Caller) {
        let mut o = self.lock();
        if o.by_id.contains_key(conversation) {
            return;
        }
        let mut evicted = 0;
        if o.per_caller.get(&caller).copied().unwrap_or(0) >= MAX_OWNED_PER_CALLER {
            if let Some(at) = o
                .order
                .iter()
                .position(|id| o.by_id.get(id) == Some(&caller))
            {
                if let Some(id) = o.order.remove(at) {
                    o.forget(&id);
                    evicted += 1;
                }
            }
        }
        while o.by_id.len() >= MAX_OWNED {
            let Some(id) = o.order.pop_front() else { break };
            if o.forget(&id) {
                evicted += 1;
            }
        }
        o.by_id.insert(conversation.into(), caller);
        *o.per_caller.entry(caller).or_default() += 1;
        o.order.push_back(conversation.into());
        if o.order.len() > 2 * MAX_OWNED {
            let OwnersInner { by_id, order, .. } = &mut *o;
            order.retain(|id| by_id.contains_key(id));
        }
        crate::metrics::state_evicted("conversations", evicted);
    }

    /// Whether `caller` may read or stop `conversation`: it owns it, or nobody is known to. An id
    /// of llama-server's router (`<id>::<model>`) is its conversation's.
    pub fn allows(&self, conversation: &str, caller: Caller) -> bool {
        let o = self.lock();
        let base = conversation.split_once("::").map(|(b, _)| b);
        [Some(conversation), base]
            .into_iter()
            .flatten()
            .filter_map(|id| o.by_id.get(id))
            .all(|owner| *owner == caller)
    }

    /// Conversations whose caller is kept.
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OwnersInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl OwnersInner {
    fn forget(&mut self, id: &str) -> bool {
        let Some(caller) = self.by_id.remove(id) else {
            return false;
        };
        if let Some(n) = self.per_caller.get_mut(&caller) {
            *n -= 1;
            if *n == 0 {
                self.per_caller.remove(&caller);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_caller_owns_a_conversation() {
        let owners = Owners::default();
        let (a, b) = (Caller::Uid(1), Caller::Key([7; 32]));
        assert!(owners.allows("c", b), "nobody owns it yet");
        owners.claim("c", a);
        owners.claim("c", b);
        assert!(owners.allows("c", a));
        assert!(!owners.allows("c", b));
        // The router's id for it on one model is the same conversation.
        assert!(!owners.allows("c::model", b));
        assert!(owners.allows("c::model", a));
        assert!(owners.allows("other", b));
    }

    #[test]
    fn one_caller_cannot_push_anothers_conversations_out() {
        let owners = Owners::default();
        owners.claim("victim", Caller::Uid(1));
        for i in 0..MAX_OWNED_PER_CALLER + 10 {
            owners.claim(&format!("flood-{i}"), Caller::Uid(2));
        }
        assert!(!owners.allows("victim", Caller::Uid(2)));
        assert_eq!(owners.len(), MAX_OWNED_PER_CALLER + 1);
    }
}
