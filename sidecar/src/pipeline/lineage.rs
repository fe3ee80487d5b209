//! Who in an agent run a request is: its session, its agent and the agent that started that one,
//! read from whichever headers its client sends (docs/sessions.md). Agents name these in their own
//! headers; one table maps them to the three ids policies, the access line and `/live` see.

use http::{HeaderMap, HeaderName};

use crate::live::Lineage;

/// Where each id is read from, the first header present winning: the generic name first (what
/// any client may send, and what policies find in their `headers`), then each agent's own.
pub const SESSION: &[&str] = &[
    "x-session-id",
    // Claude Code.
    "x-claude-code-session-id",
    // The Codex CLI: one id for a whole run, its subagents included.
    "session-id",
    // opencode (its own session; a subagent's is a child session).
    "x-session-affinity",
];

pub const AGENT: &[&str] = &[
    "x-agent-id",
    // Claude Code's subagents.
    "x-claude-code-agent-id",
    // The Codex CLI: each agent has its thread; the root's is its session id.
    "thread-id",
];

pub const PARENT: &[&str] = &[
    "x-parent-agent-id",
    // Claude Code's subagents.
    "x-claude-code-parent-agent-id",
    // opencode's subagents: the session that started theirs.
    "x-parent-session-id",
];

pub const CONVERSATION: HeaderName = HeaderName::from_static("x-conversation-id");

/// The conversation a request names (`X-Conversation-Id`, not empty): llama-server generates its
/// answer into that conversation's session, whether its client stays or not.
pub fn conversation(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(&CONVERSATION)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
}

/// The generic names the ids are shown to policies by, in `headers` (ABI v1 and v2 alike).
pub const AGENT_HEADER: &str = "x-agent-id";
pub const PARENT_HEADER: &str = "x-parent-agent-id";

/// The Codex CLI names a subagent's parent only inside this header's JSON, as `parent_thread_id`.
const CODEX_TURN: &str = "x-codex-turn-metadata";

/// An id is at most this long: an id, not a payload. A longer value is ignored.
const MOST: usize = 256;

/// Whether a header of this name may carry an id (or, for Codex, its parent's).
fn names_an_id(name: &str) -> bool {
    SESSION.contains(&name)
        || AGENT.contains(&name)
        || PARENT.contains(&name)
        || name == CONVERSATION.as_str()
}

/// The request's lineage, as its headers name it.
pub fn of(headers: &HeaderMap) -> Lineage {
    // Most requests name none of it. One pass over their few header names, already lower case,
    // tells; looking each of the eleven names up would hash every one of them, present or not.
    if !headers.keys().any(|n| names_an_id(n.as_str())) {
        return Lineage::default();
    }
    let first = |names: &[&str]| names.iter().find_map(|n| text(headers, *n));
    Lineage {
        session: first(SESSION),
        agent: first(AGENT),
        parent: first(PARENT).or_else(|| codex_parent(headers)),
        conversation: text(headers, &CONVERSATION),
    }
}

fn text(headers: &HeaderMap, name: impl http::header::AsHeaderName) -> Option<Box<str>> {
    let v = headers.get(name)?.to_str().ok()?.trim();
    (!v.is_empty() && v.len() <= MOST).then(|| v.into())
}

/// `parent_thread_id` of the Codex CLI's turn metadata, for a subagent (at most 8 KiB of JSON
/// read, and only from a client that sent a thread id).
fn codex_parent(headers: &HeaderMap) -> Option<Box<str>> {
    headers.get("thread-id")?;
    let raw = headers.get(CODEX_TURN)?.as_bytes();
    if raw.len() > 8192 {
        return None;
    }
    let meta: serde_json::Value = serde_json::from_slice(raw).ok()?;
    let parent = meta.get("parent_thread_id")?.as_str()?.trim();
    (!parent.is_empty() && parent.len() <= MOST).then(|| parent.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn ids(l: &Lineage) -> [Option<&str>; 4] {
        [
            l.session.as_deref(),
            l.agent.as_deref(),
            l.parent.as_deref(),
            l.conversation.as_deref(),
        ]
    }

    #[test]
    fn claude_code_names_its_session_and_a_subagent_its_parent() {
        let root = of(&headers(&[("X-Claude-Code-Session-Id", "s1")]));
        assert_eq!(ids(&root), [Some("s1"), None, None, None]);
        let sub = of(&headers(&[
            ("x-claude-code-session-id", "s1"),
            ("x-claude-code-agent-id", "a2"),
            ("x-claude-code-parent-agent-id", "a1"),
        ]));
        assert_eq!(ids(&sub), [Some("s1"), Some("a2"), Some("a1"), None]);
    }

    #[test]
    fn codex_names_session_and_thread_and_a_subagent_its_parent_thread() {
        let root = of(&headers(&[
            ("session-id", "s"),
            ("thread-id", "s"),
            (
                "x-codex-turn-metadata",
                r#"{"session_id":"s","agent_name":"/root"}"#,
            ),
        ]));
        assert_eq!(ids(&root), [Some("s"), Some("s"), None, None]);
        let sub = of(&headers(&[
            ("session-id", "s"),
            ("thread-id", "t2"),
            ("x-codex-turn-metadata", r#"{"parent_thread_id":"s"}"#),
        ]));
        assert_eq!(ids(&sub), [Some("s"), Some("t2"), Some("s"), None]);
    }

    #[test]
    fn opencode_subagents_are_child_sessions() {
        let sub = of(&headers(&[
            ("x-session-affinity", "child"),
            ("X-Session-Id", "child"),
            ("x-parent-session-id", "root"),
        ]));
        assert_eq!(ids(&sub), [Some("child"), None, Some("root"), None]);
    }

    #[test]
    fn the_generic_names_win_and_nonsense_is_ignored() {
        let l = of(&headers(&[
            ("x-session-id", "mine"),
            ("x-claude-code-session-id", "theirs"),
            ("x-agent-id", "   "),
            ("x-parent-agent-id", &"p".repeat(MOST + 1)),
            ("x-conversation-id", "c"),
            ("x-codex-turn-metadata", r#"{"parent_thread_id":"x"}"#),
        ]));
        // A blank or oversized id is none; Codex metadata counts only beside a thread id.
        assert_eq!(ids(&l), [Some("mine"), None, None, Some("c")]);
        assert!(of(&HeaderMap::new()).is_empty());
        let unrelated = headers(&[
            ("content-type", "application/json"),
            ("authorization", "Bearer k"),
            ("x-session", "not one of them"),
        ]);
        assert!(of(&unrelated).is_empty());
    }

    #[test]
    fn every_name_an_id_is_read_from_counts_for_the_first_pass() {
        // Each name alone, so the pass that skips requests naming none must let each through.
        for name in SESSION
            .iter()
            .chain(AGENT)
            .chain(PARENT)
            .chain([&CONVERSATION.as_str()])
        {
            let l = of(&headers(&[("content-type", "text/plain"), (name, "id")]));
            assert!(!l.is_empty(), "{name} was not read");
        }
    }
}
