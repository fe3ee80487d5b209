//! Per-tenant concurrency caps as configured: a default for every tenant (`--tenant-max-in-service`,
//! `--tenant-max-waiting`), a table per named tenant (`[tenants."NAME"]`) overriding it key by key,
//! and what a request of a tenant at its cap gets (`--tenant-over-cap wait|refuse`). A policy's
//! decision may cut a request's caps further (see `admission::cap`).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::table::Keys;
use super::{invalid, ConfigError, Settings};

/// What a request of a tenant at its in-service cap gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OverCap {
    /// It waits in the queue, passed over until one of its tenant's requests ends.
    #[default]
    Wait,
    /// It is refused at once with 429 `tenant_busy`.
    Refuse,
}

impl FromStr for OverCap {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "wait" => Ok(OverCap::Wait),
            "refuse" => Ok(OverCap::Refuse),
            _ => Err(format!("`{s}` is not an over-cap rule; use wait or refuse")),
        }
    }
}

impl fmt::Display for OverCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OverCap::Wait => "wait",
            OverCap::Refuse => "refuse",
        })
    }
}
string_serde!(OverCap);

/// A `[tenants."NAME"]` table: one tenant's own caps (NAME as the scheduler knows it: a policy's
/// `tenant`, `sha256:<hex>` of an API key, `uid:<n>`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TenantTable {
    /// The most of its requests in service at once, at least 1 (default: `tenant-max-in-service`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_service: Option<u32>,
    /// The most of its requests waiting, 0 or more (default: `tenant-max-waiting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_waiting: Option<u32>,
}

/// A `[teams."NAME"]` table: one team's cap, over all its tenants' requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TeamTable {
    /// The most of the team's requests in service at once, at least 1.
    pub max_in_service: u32,
}

/// Every tenant's caps, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantCaps {
    /// Every tenant's, unless its own table says otherwise.
    pub default: TenantTable,
    /// By tenant name.
    pub tenants: BTreeMap<String, TenantTable>,
    pub over_cap: OverCap,
    /// By team name: the most of a team's requests in service.
    pub teams: BTreeMap<String, TeamTable>,
}

impl TenantCaps {
    /// Checks the keys: an in-service cap of at least 1 (0 would never serve the tenant: to refuse
    /// it, deny it with a policy), a named tenant's table that limits something.
    pub fn new(
        default: TenantTable,
        tenants: BTreeMap<String, TenantTable>,
        over_cap: OverCap,
    ) -> Result<TenantCaps, ConfigError> {
        if default.max_in_service == Some(0) {
            return Err(invalid(
                "tenant-max-in-service",
                "must be at least 1 (0 would never serve a tenant; deny it with a policy instead)",
            ));
        }
        for (name, t) in &tenants {
            if name.is_empty() {
                return Err(invalid("tenants", "a tenant's name may not be empty"));
            }
            if t.max_in_service == Some(0) {
                return Err(invalid(
                    "tenants.max-in-service",
                    format!("tenant `{name}`: must be at least 1 (0 would never serve it; deny it with a policy instead)"),
                ));
            }
            if t.max_in_service.is_none() && t.max_waiting.is_none() {
                return Err(invalid(
                    "tenants",
                    format!("tenant `{name}`: limits nothing; give `max-in-service`, `max-waiting` or both"),
                ));
            }
        }
        Ok(TenantCaps {
            default,
            tenants,
            over_cap,
            teams: BTreeMap::new(),
        })
    }

    /// With `teams`' caps: each a valid team name and at least 1.
    pub fn with_teams(mut self, teams: BTreeMap<String, TeamTable>) -> Result<Self, ConfigError> {
        for (name, t) in &teams {
            super::check_name("team", name).map_err(|e| invalid("teams", e))?;
            if t.max_in_service == 0 {
                return Err(invalid(
                    "teams.max-in-service",
                    format!("team `{name}`: must be at least 1 (0 would never serve it)"),
                ));
            }
        }
        self.teams = teams;
        Ok(self)
    }

    /// The cap of `team`'s requests in service, when it has one.
    pub fn of_team(&self, team: &str) -> Option<usize> {
        self.teams
            .get(team)
            .map(|t| usize::try_from(t.max_in_service).unwrap_or(usize::MAX))
    }

    /// The caps of `tenant`: its own table's keys, the default's where it sets none.
    pub fn of(&self, tenant: &str) -> TenantTable {
        let own = self.tenants.get(tenant).copied().unwrap_or_default();
        TenantTable {
            max_in_service: own.max_in_service.or(self.default.max_in_service),
            max_waiting: own.max_waiting.or(self.default.max_waiting),
        }
    }

    /// Whether any tenant is capped.
    pub fn any(&self) -> bool {
        self.default != TenantTable::default() || !self.tenants.is_empty()
    }
}

/// `--tenant-*` and the `[tenants."NAME"]` tables.
impl Keys<Settings> for TenantCaps {
    type Value = TenantCaps;
    fn read(s: &Settings) -> Result<TenantCaps, ConfigError> {
        let default = TenantTable {
            max_in_service: s.tenant_max_in_service,
            max_waiting: s.tenant_max_waiting,
        };
        let tenants = s.tenants.clone().unwrap_or_default();
        TenantCaps::new(default, tenants, s.tenant_over_cap.unwrap_or_default())?
            .with_teams(s.teams.clone().unwrap_or_default())
    }
    fn write(v: &TenantCaps, s: &mut Settings) {
        s.tenant_max_in_service = v.default.max_in_service;
        s.tenant_max_waiting = v.default.max_waiting;
        s.tenant_over_cap = Some(v.over_cap);
        s.tenants = (!v.tenants.is_empty()).then(|| v.tenants.clone());
        s.teams = (!v.teams.is_empty()).then(|| v.teams.clone());
    }
}
