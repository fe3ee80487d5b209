//! The audit trail: one line for every admin call that changes something (let in or turned away) and
//! for every reload, saying who (peer uid and pid, or address; or the signal), what (the action, the
//! route, the slot or model), the answer and the request id; and a count per action and result,
//! `slotgate_admin_actions_total`. Lines go with the log under the target `slotgate::audit`, or to a
//! file of their own (`--audit-log`), one JSON object a line, so an operator can keep them apart.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

use http::Method;
use serde_json::{json, Map, Value};

use super::auth::Caller;
use crate::config::AuditLog;
use crate::metrics as m;
use crate::owner_only::{self, FileError};

/// The log target of audit lines on stderr.
pub const TARGET: &str = "slotgate::audit";

/// The longest client-given string (a model name, a file name) an audit line keeps.
const MAX_FIELD: usize = 200;

/// The file audit lines are appended to, when one is configured.
static FILE: OnceLock<Mutex<std::fs::File>> = OnceLock::new();

/// Opens the audit file, if one is configured: created 0600, an existing one made 0600, and one
/// that is a link or another user's refused (`owner_only`). A start fails when it cannot be
/// opened, rather than run without its trail.
pub fn open(log: &AuditLog) -> Result<(), FileError> {
    let AuditLog::File(path) = log else {
        return Ok(());
    };
    let file = owner_only::open(path, std::fs::OpenOptions::new().create(true).append(true))?;
    let _ = FILE.set(Mutex::new(file));
    Ok(())
}

/// Who an audit line names.
#[derive(Debug, Clone, Copy)]
pub enum Who<'a> {
    Caller(&'a Caller),
    /// slotgate itself, for this reason (`SIGHUP`, `file change`).
    Process(&'a str),
}

/// One audited event.
#[derive(Debug, Default)]
pub struct Entry<'a> {
    pub action: &'static str,
    pub who: Option<Who<'a>>,
    pub method: Option<&'a str>,
    pub path: Option<&'a str>,
    pub slot: Option<&'a str>,
    pub model: Option<String>,
    pub filename: Option<String>,
    /// The HTTP status answered (0 for a reload).
    pub status: u16,
    pub result: &'static str,
    pub request_id: Option<&'a str>,
    /// With which credentials llama-server was reached: `slotgate_key`, `caller`, `none`; `-` when
    /// it was not.
    pub credentials: &'static str,
    /// What else a reload says (the policies it changed, why it was rejected).
    pub detail: Option<String>,
}

/// Writes `e` and counts it.
pub fn record(e: &Entry<'_>) {
    metrics::counter!(m::ADMIN_ACTIONS_TOTAL, "action" => e.action, "result" => e.result)
        .increment(1);
    let (uid, pid, addr, by) = match e.who {
        Some(Who::Caller(Caller::Unix(p))) => (Some(p.uid), p.pid, None, None),
        Some(Who::Caller(Caller::Tcp(a))) => (None, None, Some(*a), None),
        Some(Who::Caller(Caller::Unknown)) | None => (None, None, None, None),
        Some(Who::Process(why)) => (None, None, None, Some(why)),
    };
    if let Some(file) = FILE.get() {
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            json!(humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()),
        );
        line.insert("action".into(), json!(e.action));
        line.insert("result".into(), json!(e.result));
        let fields: [(&str, Value); 12] = [
            ("status", json!(e.status)),
            ("peer_uid", json!(uid)),
            ("peer_pid", json!(pid)),
            ("peer_addr", json!(addr.map(|a| a.to_string()))),
            ("by", json!(by)),
            ("method", json!(e.method)),
            ("path", json!(e.path)),
            ("slot", json!(e.slot)),
            ("model", json!(e.model)),
            ("filename", json!(e.filename)),
            ("request_id", json!(e.request_id)),
            ("credentials", json!(e.credentials)),
        ];
        line.extend(
            fields
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.to_owned(), v)),
        );
        if let Some(d) = &e.detail {
            line.insert("detail".into(), json!(d));
        }
        let mut text = Value::Object(line).to_string();
        text.push('\n');
        let mut f = file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if f.write_all(text.as_bytes()).is_ok() {
            return;
        }
        tracing::error!("cannot append to the audit log; this line goes to stderr");
    }
    tracing::info!(
        target: TARGET,
        action = e.action,
        result = e.result,
        status = e.status,
        peer_uid = uid,
        peer_pid = pid,
        peer_addr = addr.map(tracing::field::display),
        by,
        method = e.method,
        path = e.path,
        slot = e.slot,
        model = e.model.as_deref(),
        filename = e.filename.as_deref(),
        request_id = e.request_id,
        credentials = e.credentials,
        detail = e.detail.as_deref(),
        "admin action"
    );
    // Out now, not with the next batch: the trail is read while things happen.
    crate::log::flush();
}

/// A change on its way to llama-server, written down however it ends: with its answer
/// ([`Pending::finish`]), or `client_gone` when the caller leaves before it (the request future is
/// dropped), since llama-server may have done it all the same.
pub struct Pending {
    action: &'static str,
    caller: Caller,
    method: String,
    path: String,
    slot: Option<String>,
    model: Option<String>,
    filename: Option<String>,
    request_id: String,
    credentials: &'static str,
    /// A quota change's target and amount.
    detail: Option<String>,
    written: bool,
}

impl Pending {
    /// The change `method` `uri` asks for, with its `body`, as `caller` sent it; llama-server reached
    /// with `credentials` (`-` when it is not).
    pub fn new(
        caller: &Caller,
        method: &Method,
        uri: &http::Uri,
        body: &[u8],
        request_id: &str,
        credentials: &'static str,
    ) -> Pending {
        let (path, query) = (uri.path(), uri.query());
        let (slot, model, filename) = targets(path, query, body);
        Pending {
            action: action(method, path, query),
            caller: *caller,
            method: method.as_str().to_owned(),
            path: path.to_owned(),
            slot: slot.map(str::to_owned),
            model,
            filename,
            request_id: request_id.to_owned(),
            credentials,
            detail: quota_detail(path, body),
            written: false,
        }
    }

    /// Written with llama-server's answer (`reached`), or slotgate's own when it could not be.
    pub fn finish(self, status: u16, reached: bool) {
        let result = if reached {
            result_of(status)
        } else {
            "upstream_error"
        };
        self.refused(status, result);
    }

    /// Written with slotgate's own answer, before anything was forwarded (401, 403, 400).
    pub fn refused(mut self, status: u16, result: &'static str) {
        self.write(status, result);
    }

    fn write(&mut self, status: u16, result: &'static str) {
        self.written = true;
        record(&Entry {
            action: self.action,
            who: Some(Who::Caller(&self.caller)),
            method: Some(&self.method),
            path: Some(&self.path),
            slot: self.slot.as_deref(),
            model: self.model.take(),
            filename: self.filename.take(),
            status,
            result,
            request_id: Some(&self.request_id),
            credentials: self.credentials,
            detail: self.detail.take(),
        });
    }
}

/// What a quota change names (`policy=… key=… period=… limit=…`), cut to a bounded length.
fn quota_detail(path: &str, body: &[u8]) -> Option<String> {
    if !path.starts_with("/quotas/") {
        return None;
    }
    let v: Value = serde_json::from_slice(body).ok()?;
    let mut out = String::new();
    for field in ["policy", "key", "period", "limit", "amount"] {
        if let Some(x) = v.get(field) {
            let text = x.as_str().map_or_else(|| x.to_string(), str::to_owned);
            out.push_str(&format!("{field}={} ", bounded(&text)));
        }
    }
    Some(out.trim_end().to_owned())
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.written {
            self.write(0, "client_gone");
        }
    }
}

/// The audited name of a call that changes the server (`slot_save`, `model_unload`, ...).
pub fn action(method: &Method, path: &str, query: Option<&str>) -> &'static str {
    let post = method == Method::POST;
    match path {
        p if post && p.starts_with("/slots/") => match param(query, "action").as_deref() {
            Some("save") => "slot_save",
            Some("restore") => "slot_restore",
            Some("erase") => "slot_erase",
            _ => "slot_other",
        },
        "/lora-adapters" if post => "lora_set",
        "/props" if post => "props_set",
        "/models" if post => "model_add",
        "/models/load" if post => "model_load",
        "/models/unload" if post => "model_unload",
        "/models" if method == Method::DELETE => "model_delete",
        "/quotas/set" if post => "quota_set",
        "/quotas/top-up" if post => "quota_top_up",
        "/quotas/reset" if post => "quota_reset",
        "/quotas/grant" if post => "quota_grant",
        "/keys" if post => "key_create",
        p if post && p.starts_with("/keys/") && p.ends_with("/revoke") => "key_revoke",
        p if post && p.starts_with("/keys/") && p.ends_with("/rotate") => "key_rotate",
        _ => "other",
    }
}

/// What the call names: the slot of `/slots/N`, the model (the body's `model`, or `?model=`), the
/// file of a slot save or restore. Client strings are cut to a bounded length.
fn targets<'a>(
    path: &'a str,
    query: Option<&str>,
    body: &[u8],
) -> (Option<&'a str>, Option<String>, Option<String>) {
    let slot = path.strip_prefix("/slots/").filter(|s| !s.is_empty());
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(name))
            .and_then(Value::as_str)
            .map(bounded)
    };
    let model = field("model").or_else(|| param(query, "model").map(|m| bounded(&m)));
    (slot, model, field("filename"))
}

fn param(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

fn bounded(s: &str) -> String {
    s.chars().take(MAX_FIELD).collect()
}

/// The result label of an answer llama-server gave.
pub fn result_of(status: u16) -> &'static str {
    match status {
        200..=399 => "ok",
        400..=499 => "upstream_4xx",
        _ => "upstream_5xx",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_change_has_its_name() {
        let a = |m: Method, p: &str, q: Option<&str>| action(&m, p, q);
        assert_eq!(
            a(Method::POST, "/slots/0", Some("action=save")),
            "slot_save"
        );
        assert_eq!(
            a(Method::POST, "/slots/3", Some("action=erase")),
            "slot_erase"
        );
        assert_eq!(a(Method::POST, "/slots/3", None), "slot_other");
        assert_eq!(a(Method::POST, "/lora-adapters", None), "lora_set");
        assert_eq!(a(Method::POST, "/props", None), "props_set");
        assert_eq!(a(Method::POST, "/models/unload", None), "model_unload");
        assert_eq!(
            a(Method::DELETE, "/models", Some("model=x")),
            "model_delete"
        );
        assert_eq!(a(Method::POST, "/models", None), "model_add");
    }

    #[test]
    fn the_targets_come_from_the_path_the_body_and_the_query() {
        let (slot, model, file) = targets("/slots/1", None, br#"{"filename":"x.bin"}"#);
        assert_eq!(
            (slot, model, file.as_deref()),
            (Some("1"), None, Some("x.bin"))
        );
        let (_, model, _) = targets("/models", Some("model=a%20b"), b"");
        assert_eq!(model.as_deref(), Some("a b"));
        let long = format!(r#"{{"model":"{}"}}"#, "m".repeat(1000));
        let (_, model, _) = targets("/models/load", None, long.as_bytes());
        assert_eq!(model.unwrap().len(), MAX_FIELD);
    }
}
