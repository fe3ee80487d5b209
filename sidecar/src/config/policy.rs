//! The `[[policy]]` entries and the `--policy` flags: which modules, with which settings, how
//! their decisions count, and their limits.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::table::Keys;
use super::values::{ByteSize, Dur};
use super::{invalid, ConfigError, Settings};

/// One `[[policy]]` entry: a module, its settings, how its decisions count, and its limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PolicySpec {
    /// Name in logs and metric labels. [default: the file name without extension]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The module (.wasm, or .wat text).
    pub path: PathBuf,
    /// Settings as an inline table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<toml::Value>,
    /// Settings from a file (JSON, or TOML by extension) instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings_file: Option<PathBuf>,
    /// `enforce` (default): the decision counts. `monitor`: evaluated, logged, counted, ignored.
    #[serde(default)]
    pub mode: PolicyMode,
    /// What a failed evaluation (trap, timeout, fuel, memory, bad output) means: `deny` (default,
    /// fail closed with 503) or `allow`.
    #[serde(default)]
    pub on_error: PolicyOnError,
    /// Fuel one evaluation may burn. [default: 10000000]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// Deadline of one evaluation, in the time it ran: time spent waiting for a core is not counted,
    /// up to a wall-clock ceiling of a few deadlines. [default: 20ms]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Dur>,
    /// Largest linear memory. [default: 16MiB]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    /// How long an instance of a v2 component lives: `caller` (default) keeps one for each caller
    /// (API key, else uid and gid) across that caller's calls; `call` starts a fresh one for every
    /// call. A v1 module always runs each call in a fresh instance (docs/policies.md, "Isolation").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<PolicyIsolation>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyIsolation {
    Call,
    Caller,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyMode {
    #[default]
    Enforce,
    Monitor,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyOnError {
    #[default]
    Deny,
    Allow,
}

impl PolicySpec {
    pub fn from_path(path: PathBuf, settings_file: Option<PathBuf>) -> Self {
        PolicySpec {
            name: None,
            path,
            settings: None,
            settings_file,
            mode: PolicyMode::Enforce,
            on_error: PolicyOnError::Deny,
            fuel: None,
            deadline: None,
            memory: None,
            isolation: None,
        }
    }

    pub fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            self.path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("policy")
                .to_owned()
        })
    }
}

/// The policy chain: the file's `[[policy]]` entries, then the `--policy` flags (paired with their
/// settings by `cli::parse`); printed as `[[policy]]` entries.
pub(super) struct PolicyChain;

impl Keys<Settings> for PolicyChain {
    type Value = Vec<PolicySpec>;
    fn read(s: &Settings) -> Result<Vec<PolicySpec>, ConfigError> {
        policy_chain(s.policy.clone(), s.policy_flags.clone())
    }
    fn write(v: &Vec<PolicySpec>, s: &mut Settings) {
        s.policy = (!v.is_empty()).then(|| v.clone());
    }
}

/// File entries first, then the `--policy` flags (already paired with their settings).
fn policy_chain(
    file: Option<Vec<PolicySpec>>,
    flags: Option<Vec<PolicySpec>>,
) -> Result<Vec<PolicySpec>, ConfigError> {
    let mut chain = file.unwrap_or_default();
    chain.extend(flags.unwrap_or_default());
    let mut names = std::collections::HashSet::new();
    for spec in &chain {
        if spec.settings.is_some() && spec.settings_file.is_some() {
            return Err(invalid(
                "policy",
                format!(
                    "{}: give `settings` or `settings-file`, not both",
                    spec.path.display()
                ),
            ));
        }
        check_policy_limits(spec)?;
        if !names.insert(spec.display_name()) {
            return Err(invalid(
                "policy",
                format!(
                    "two policies are named `{}`; set `name`",
                    spec.display_name()
                ),
            ));
        }
    }
    Ok(chain)
}

/// The most linear memory one policy instance may have: the engine's instance pool is sized by it.
pub const POLICY_MAX_MEMORY_BYTES: usize = 64 << 20;

/// A policy's limits must be positive, and its memory must fit the engine's instance pool.
pub fn check_policy_limits(spec: &PolicySpec) -> Result<(), ConfigError> {
    let at = || spec.path.display().to_string();
    let max = POLICY_MAX_MEMORY_BYTES;
    if spec.fuel == Some(0) {
        return Err(invalid(
            "policy",
            format!("{}: fuel must be positive", at()),
        ));
    }
    if spec.deadline.is_some_and(|d| d.0.is_zero()) {
        return Err(invalid(
            "policy",
            format!("{}: deadline must be longer than zero", at()),
        ));
    }
    match spec.memory {
        Some(ByteSize(m)) if m < 64 << 10 => Err(invalid(
            "policy",
            format!("{}: memory must be at least one wasm page (64KiB)", at()),
        )),
        Some(ByteSize(m)) if m > max => Err(invalid(
            "policy",
            format!(
                "{}: memory is over the {}MiB a policy may have",
                at(),
                max >> 20
            ),
        )),
        _ => Ok(()),
    }
}
