//! Hot reload of the policy chain and the admin tokens, on SIGHUP and when a watched file changes
//! (the config file, a policy module, a settings file, a token file). The configuration is read
//! again and the new chain built on a blocking thread, then swapped in atomically; a broken one is
//! rejected, logged and counted, and the old chain (and tokens) keep serving. Requests already
//! evaluating finish on the version they started with. Every reload is audited.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::signal::unix::Signal;

use crate::admin::audit::{self, Entry, Who};
use crate::config::{AdminTokens, Config, PolicySpec};
use crate::metrics as m;
use crate::policy::{set::hex, Reload};
use crate::state::App;

/// Where the configuration comes from, so a reload can read it again exactly as the start did
/// (the same flags and environment over the file as it is now).
#[derive(Clone)]
pub struct ConfigSource {
    /// The `--config` file, watched for changes.
    pub file: Option<PathBuf>,
    pub load: Arc<dyn Fn() -> anyhow::Result<Config> + Send + Sync>,
}

impl ConfigSource {
    /// A source that always gives `config` (no file to re-read): reloads re-read only the policy
    /// modules and settings files.
    pub fn fixed(config: Config) -> Self {
        ConfigSource {
            file: None,
            load: Arc::new(move || Ok(config.clone())),
        }
    }
}

/// Label of `slotgate_policy_reloads_total` when the configuration itself could not be read.
const CONFIG_LABEL: &str = "(config)";

/// Serves reload requests until the task is aborted: SIGHUP, and a poll of the watched files every
/// `config.policy_watch`. A file must look the same on two polls in a row before it is loaded, so a
/// file caught half-written is not loaded.
pub async fn run(app: Arc<App>, source: ConfigSource, mut hangup: Signal) {
    let mut watched = watch_list(&app.config, &source, &app.config.policies);
    let mut loaded = stamps(&watched);
    let mut last = loaded.clone();
    let period = app.config.policy_watch.unwrap_or(Duration::from_secs(3600));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // The files as they were before this reload read them: one changed while it ran is seen
        // as changed at the next poll, not taken for what was loaded.
        let (trigger, before) = tokio::select! {
            _ = hangup.recv() => ("SIGHUP", stamps(&watched)),
            _ = tick.tick(), if app.config.policy_watch.is_some() => {
                let now = stamps(&watched);
                if now != last {
                    last = now;
                    continue;
                }
                if now == loaded {
                    continue;
                }
                ("file change", now)
            }
        };
        loaded = before;
        if let Some(specs) = reload(&app, &source, trigger).await {
            let now_watched = watch_list(&app.config, &source, &specs);
            if now_watched != watched {
                watched = now_watched;
                loaded = stamps(&watched);
            }
        }
        last = loaded.clone();
    }
}

/// Reads the configuration again and reloads the chain from it. Returns the policy specs read, if
/// the configuration could be read.
pub async fn reload(
    app: &Arc<App>,
    source: &ConfigSource,
    trigger: &str,
) -> Option<Vec<PolicySpec>> {
    reload_keys_file(app, trigger).await;
    tracing::info!(
        trigger,
        "policy reload: reading the configuration and policy files"
    );
    let work = {
        let (app, source) = (app.clone(), source.clone());
        move || read_and_reload(&app, &source)
    };
    let audit = |result: &'static str, detail: String| {
        audit::record(&Entry {
            action: "reload",
            who: Some(Who::Process(trigger)),
            result,
            credentials: "-",
            detail: Some(detail),
            ..Entry::default()
        })
    };
    let (specs, outcome, tokens) = match tokio::task::spawn_blocking(work).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => {
            metrics::counter!(m::POLICY_RELOADS_TOTAL, "policy" => CONFIG_LABEL, "result" => "error")
                .increment(1);
            let error = format!("{e:#}");
            tracing::error!(trigger, error, "policy reload rejected: cannot read the configuration; the current policies and admin tokens keep serving");
            audit("rejected", error);
            return None;
        }
        Err(e) => {
            tracing::error!(trigger, error = %e, "policy reload failed; the current policies keep serving");
            audit("rejected", e.to_string());
            return None;
        }
    };
    let tokens_changed = app.set_admin_tokens(tokens);
    if tokens_changed {
        tracing::info!(trigger, "admin tokens re-read: the new ones are in force");
    }
    let result = match (&outcome, tokens_changed) {
        (Reload::Swapped { .. }, _) | (Reload::Unchanged, true) => "swapped",
        (Reload::Unchanged, false) => "unchanged",
        (Reload::Rejected(_), _) => "rejected",
    };
    audit(result, detail(&outcome, tokens_changed));
    log_outcome(app, trigger, outcome);
    Some(specs)
}

/// Reads the keys file (`--keys-file`) again, when it changed; a file that does not read leaves the
/// keys read before in force. Audited as `keys_file`.
async fn reload_keys_file(app: &Arc<App>, trigger: &str) {
    let Some(path) = app.config.keys_file.clone() else {
        return;
    };
    let keys = app.keys.clone();
    let now = crate::budgets::wall_ms();
    let read = tokio::task::spawn_blocking(move || keys.load_file(&path, now))
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    let (result, detail) = match read {
        Ok(None) => return,
        Ok(Some(n)) => {
            tracing::info!(
                trigger,
                keys = n,
                "keys file re-read: its keys are in force"
            );
            metrics::counter!(m::KEYS_FILE_READS_TOTAL, "result" => "ok").increment(1);
            ("swapped", format!("{n} keys"))
        }
        Err(error) => {
            tracing::error!(
                trigger,
                error,
                "keys file rejected: the keys read before stay in force"
            );
            metrics::counter!(m::KEYS_FILE_READS_TOTAL, "result" => "error").increment(1);
            ("rejected", error)
        }
    };
    audit::record(&Entry {
        action: "keys_file",
        who: Some(Who::Process(trigger)),
        result,
        credentials: "-",
        detail: Some(detail),
        ..Entry::default()
    });
}

/// Off the runtime: reads the configuration and reloads the chain from it.
fn read_and_reload(
    app: &App,
    source: &ConfigSource,
) -> anyhow::Result<(Vec<PolicySpec>, Reload, AdminTokens)> {
    let config = (source.load)()?;
    let changed = changed_apart_from_policies(&app.config, &config);
    if !changed.is_empty() {
        tracing::warn!(
            changed = %changed.join(", "),
            "settings other than the policy chain changed; they take effect only on restart"
        );
    }
    let outcome = app.policies.reload(&config.policies);
    // Compiling freed megabytes into malloc's arenas: give them back (`memory::trim`).
    if !matches!(outcome, Reload::Unchanged) {
        crate::app::memory::trim();
    }
    Ok((config.policies, outcome, config.admin.tokens))
}

/// The audit record's words for a reload's outcome.
fn detail(outcome: &Reload, tokens_changed: bool) -> String {
    let policies = match outcome {
        Reload::Unchanged => "policies unchanged".to_owned(),
        Reload::Swapped {
            generation,
            changed,
            removed,
        } => format!("policies generation {generation}; changed {changed:?}; removed {removed:?}"),
        Reload::Rejected(errors) => {
            let names: Vec<&str> = errors.iter().map(|e| e.name.as_str()).collect();
            format!("policies rejected: {names:?}")
        }
    };
    if tokens_changed {
        policies + "; admin tokens replaced"
    } else {
        policies
    }
}

/// The log's words for a reload's outcome.
fn log_outcome(app: &App, trigger: &str, outcome: Reload) {
    match outcome {
        Reload::Unchanged => tracing::info!(trigger, "policy reload: nothing changed"),
        Reload::Swapped {
            generation,
            changed,
            removed,
        } => {
            let chain = app.policies.current();
            let serving: Vec<String> = chain
                .policies()
                .map(|p| format!("{}@{}", p.name, &hex(&p.sha256)[..12]))
                .collect();
            tracing::info!(
                trigger,
                generation,
                changed = ?changed,
                removed = ?removed,
                serving = ?serving,
                "policy reload: new chain serving"
            );
        }
        Reload::Rejected(errors) => {
            for e in &errors {
                tracing::error!(trigger, policy = %e.name, path = %e.path, error = %e.error, "policy reload rejected; the current policies keep serving");
            }
        }
    }
}

/// Whether `a` and `b` agree on every setting a reload cannot apply.
/// The settings, as `slotgate check` names them (`queue-depth`, `state.fetch-timeout`), whose values
/// differ between `a` and `b`, the policy chain apart (a reload applies that).
fn changed_apart_from_policies(a: &Config, b: &Config) -> Vec<String> {
    let table = |c: &Config| {
        let mut s = c.effective();
        s.policy = None;
        toml::Table::try_from(&s).unwrap_or_default()
    };
    let mut changed = Vec::new();
    diff("", &table(a), &table(b), &mut changed);
    changed
}

fn diff(prefix: &str, a: &toml::Table, b: &toml::Table, out: &mut Vec<String>) {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let name = format!("{prefix}{key}");
        match (a.get(key), b.get(key)) {
            (Some(toml::Value::Table(x)), Some(toml::Value::Table(y))) => {
                diff(&format!("{name}."), x, y, out)
            }
            (x, y) if x != y => out.push(name),
            _ => {}
        }
    }
}

fn watch_list(config: &Config, source: &ConfigSource, specs: &[PolicySpec]) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = source.file.iter().cloned().collect();
    files.extend(config.admin.token_file.clone());
    files.extend(config.admin.read_token_file.clone());
    files.extend(config.keys_file.clone());
    for spec in specs {
        files.push(spec.path.clone());
        files.extend(spec.settings_file.clone());
    }
    files
}

/// What the watch compares: each file's modification time, size and inode (a rename over the file
/// changes the inode even when the time and size do not).
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamps(files: &[PathBuf]) -> Vec<Stamp> {
    use std::os::unix::fs::MetadataExt;
    files
        .iter()
        .map(|f| {
            let md = std::fs::metadata(f).ok()?;
            Some((md.modified().ok()?, md.len(), md.ino()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_names_the_settings_that_need_a_restart() {
        let parse = |toml_text: &str| {
            let settings: crate::config::Settings = toml::from_str(toml_text).unwrap();
            Config::from_settings(settings).unwrap()
        };
        let a = parse("queue-depth = 8\n");
        assert!(changed_apart_from_policies(&a, &parse("queue-depth = 8\n")).is_empty());
        let b = parse("queue-depth = 9\n[state]\nfetch-timeout = \"7ms\"\n");
        assert_eq!(
            changed_apart_from_policies(&a, &b),
            ["queue-depth", "state.fetch-timeout"]
        );
    }
}
