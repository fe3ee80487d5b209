//! Who sent a request, as the host names it: the caller's identity is decided once by slotgate and
//! handed to every policy (`caller` in ABI v1's request, the host's header [`CALLER_HEADER`] in
//! contract 2.0.0's); policies only read it.

use std::fmt;

use crate::types::RequestSummary;

/// A caller's identity, in the order the host trusts what a request carries: the tenant slotgate
/// named (a key it issued, `--client-auth keys`), else the API key (as its `sha256:<hex>` hash),
/// else the Unix-socket peer's uid, else anonymous.
///
/// Its `Display` form is a stable key for settings and host state: the tenant's name (which holds
/// no `:`), `sha256:<hex>`, `uid:<n>` or `anonymous`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Identity<'a> {
    /// The tenant slotgate named.
    Tenant(&'a str),
    /// The hashed bearer token, `sha256:<hex>`.
    ApiKey(&'a str),
    /// The Unix-socket peer's effective uid (no API key was sent).
    Uid(u32),
    /// Neither: a TCP client without an API key.
    Anonymous,
}

/// The header in which the host gives a component (contract 2.0.0, no field for it) the caller's
/// identity, in [`Identity`]'s `Display` form; always sent. A client cannot send it: policies see
/// only allow-listed headers, and this is the host's.
pub const CALLER_HEADER: &str = "x-slotgate-caller";

/// The headers in which slotgate lists, for a policy of contract 2.0.0 (no fields for them), the
/// tenant, team and key id it named the caller by (`--client-auth keys`). A client cannot send
/// them: policies see only allow-listed headers, and these are the host's.
pub const TENANT_NAMED_HEADER: &str = "x-slotgate-tenant";
/// The team of the caller's key (see [`TENANT_NAMED_HEADER`]).
pub const TEAM_NAMED_HEADER: &str = "x-slotgate-team";
/// The id of the caller's key (see [`TENANT_NAMED_HEADER`]).
pub const KEY_ID_HEADER: &str = "x-slotgate-key-id";
/// The labels of the caller's key, as one JSON object (see [`TENANT_NAMED_HEADER`]).
pub const KEY_LABELS_HEADER: &str = "x-slotgate-key-labels";
/// The price of the model a request is booked under, as one JSON object ([`crate::Price`]'s
/// members), when the operator's `[prices]` prices it (see [`TENANT_NAMED_HEADER`]).
pub const PRICE_HEADER: &str = "x-slotgate-price";
/// In `on_complete`'s request only: what it used beyond the record's counts, as one JSON object
/// (`cached_tokens`, `cached_weight`, `cost`: [`crate::Completion`]'s members).
pub const USAGE_HEADER: &str = "x-slotgate-usage";

/// Whether `s` is a tenant's name as slotgate's keys give them: 1 to 64 of `A-Z a-z 0-9 . _ @ -`,
/// not a name slotgate gives callers itself, and not shaped like a raw API key (`sk-…`, `sgk_…`):
/// a key pasted into settings must be refused, not taken for a name that never matches.
pub fn is_tenant_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'))
        && !matches!(s, "anonymous" | "other")
        && !looks_like_a_key(s)
}

/// A raw key's common prefixes: OpenAI's and Anthropic's `sk-`, slotgate's own `sgk_`.
fn looks_like_a_key(s: &str) -> bool {
    ["sk-", "sk_", "sgk_"].iter().any(|p| s.starts_with(p))
}

/// Checks a tenant named in a policy's settings: a tenant's name (a key slotgate issued names it,
/// [`is_tenant_name`]), a hashed key ([`is_hashed_key`]), `uid:<n>`, `anonymous`, or, when the
/// policy has a `tenant_header` (`by_header`), `header:<value>`, as [`RequestSummary::tenant_key`]
/// names them.
pub fn check_tenant(tenant: &str, by_header: bool) -> Result<(), String> {
    let known = is_tenant_name(tenant)
        || is_hashed_key(tenant)
        || by_header
            && tenant
                .strip_prefix("header:")
                .is_some_and(|v| !v.is_empty())
        || tenant == "anonymous"
        || tenant
            .strip_prefix("uid:")
            .is_some_and(|n| n.parse::<u32>().is_ok());
    if known {
        return Ok(());
    }
    Err(format!(
        "tenant `{tenant}` is not a tenant's name (as `slotgate key create --tenant` gives it; \
         never a raw key), \
         `sha256:<64 hex>` (`slotgate hash-key KEY` prints it), `uid:<n>`, `anonymous` or, with \
         tenant_header, `header:<value>`"
    ))
}

impl RequestSummary {
    /// The exact prompt tokens when slotgate could count them, else the estimate.
    pub fn prompt_tokens_best(&self) -> u64 {
        self.prompt_tokens.unwrap_or(self.prompt_tokens_estimate)
    }

    /// Whether an agent's subagent sent it: its client named the agent that started its own
    /// (`parent_agent_id`, docs/sessions.md).
    pub fn is_subagent(&self) -> bool {
        self.parent_agent_id.is_some()
    }

    /// The caller's [`Identity`], as the host named it (`caller`); `anonymous` when it named none
    /// (a request summary written by hand).
    pub fn identity(&self) -> Identity<'_> {
        self.caller
            .as_deref()
            .map_or(Identity::Anonymous, Identity::parse)
    }

    /// The host's rule for the caller's identity: the tenant slotgate named, else the API key,
    /// else the Unix-socket peer's uid, else anonymous. slotgate applies it once per request and
    /// sends the result as `caller`; a policy reads [`RequestSummary::identity`] (the rule is not
    /// compiled into policies).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn name_caller(&self) -> String {
        let identity = match (&self.tenant, &self.api_key, &self.peer) {
            (Some(t), _, _) => Identity::Tenant(t),
            (None, Some(key), _) => Identity::ApiKey(key),
            (None, None, Some(peer)) => Identity::Uid(peer.uid),
            (None, None, None) => Identity::Anonymous,
        };
        identity.to_string()
    }
}

/// The request headers policies see that name a caller on behalf of a router in front (LiteLLM
/// calls with one key for all its callers and forwards theirs): what a policy's `tenant_header`
/// setting may name.
pub const TENANT_HEADERS: &[&str] = &["x-tenant", "openai-organization", "openai-project"];

/// Checks a `tenant_header` setting against [`TENANT_HEADERS`].
pub fn check_tenant_header(header: &str) -> Result<(), String> {
    if TENANT_HEADERS.contains(&header) {
        return Ok(());
    }
    Err(format!(
        "tenant_header `{header}` is not a header policies see; use one of {}",
        TENANT_HEADERS.join(", ")
    ))
}

impl RequestSummary {
    /// Whom a budget or quota is kept for: `header:<value>` of `tenant_header` when the request
    /// carries it (not empty), else its [`Identity`]. Any client that reaches slotgate can set the
    /// header: use it only when a router in front is the only caller.
    pub fn tenant_key(&self, tenant_header: Option<&str>) -> String {
        match tenant_header
            .and_then(|h| self.headers.get(h))
            .filter(|v| !v.is_empty())
        {
            Some(value) => format!("header:{value}"),
            None => self.identity().to_string(),
        }
    }
}

impl<'a> Identity<'a> {
    /// The identity named by its `Display` form.
    pub fn parse(s: &'a str) -> Identity<'a> {
        if s == "anonymous" {
            return Identity::Anonymous;
        }
        if s.starts_with("sha256:") {
            return Identity::ApiKey(s);
        }
        match s.strip_prefix("uid:").map(str::parse) {
            Some(Ok(uid)) => Identity::Uid(uid),
            _ => Identity::Tenant(s),
        }
    }
}

impl fmt::Display for Identity<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Tenant(name) | Identity::ApiKey(name) => f.write_str(name),
            Identity::Uid(uid) => write!(f, "uid:{uid}"),
            Identity::Anonymous => f.write_str("anonymous"),
        }
    }
}

/// Whether `s` has the shape of a hashed API key, `sha256:` and 64 lower-case hex digits. Settings
/// that list raw keys never match (the host hashes every key), so validate them with this.
pub fn is_hashed_key(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Peer;

    #[test]
    fn the_host_names_the_key_before_the_uid_before_nobody() {
        let mut r = RequestSummary::default();
        assert_eq!(r.name_caller(), "anonymous");
        r.peer = Some(Peer {
            uid: 1000,
            gid: 1000,
            pid: None,
        });
        assert_eq!(r.name_caller(), "uid:1000");
        r.api_key = Some("sha256:ab".into());
        assert_eq!(r.name_caller(), "sha256:ab");
        r.tenant = Some("alice".into());
        assert_eq!(r.name_caller(), "alice");
    }

    #[test]
    fn a_policy_reads_the_identity_the_host_named() {
        let mut r = RequestSummary {
            api_key: Some("sha256:ab".into()),
            ..RequestSummary::default()
        };
        // Named by nobody: a policy derives nothing from the fields.
        assert_eq!(r.identity(), Identity::Anonymous);
        for (caller, identity) in [
            ("alice", Identity::Tenant("alice")),
            ("sha256:ab", Identity::ApiKey("sha256:ab")),
            ("uid:1000", Identity::Uid(1000)),
            ("anonymous", Identity::Anonymous),
        ] {
            r.caller = Some(caller.into());
            assert_eq!(r.identity(), identity);
            assert_eq!(r.identity().to_string(), caller);
            assert_eq!(r.tenant_key(None), caller);
        }
        r.headers.insert("x-tenant".into(), "team-a".into());
        assert_eq!(r.tenant_key(Some("x-tenant")), "header:team-a");
        r.headers.insert("x-tenant".into(), String::new());
        assert_eq!(r.tenant_key(Some("x-tenant")), "anonymous");
    }

    #[test]
    fn hashed_keys_are_recognised() {
        let good = format!("sha256:{}", "0a".repeat(32));
        assert!(is_hashed_key(&good));
        assert!(!is_hashed_key("sk-secret"));
        assert!(!is_hashed_key(&good.to_uppercase()));
        assert!(!is_hashed_key(&good[..good.len() - 1]));
    }
}
