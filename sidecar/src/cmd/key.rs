//! `slotgate key …`: the keys a running slotgate issues to its callers (docs/keys.md), through
//! its admin listener with the admin token. `create` and `rotate` print the secret once; nothing
//! else ever shows it.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::admin_client::AdminArgs;
use super::quota::{call, text};

/// What a new key names: `key create` and `key mint` alike.
#[derive(Debug, Args)]
pub struct KeyFields {
    /// Whom it is for: 1 to 64 of A-Z a-z 0-9 . _ @ -.
    #[arg(long)]
    tenant: String,
    /// The team the tenant belongs to (same characters).
    #[arg(long)]
    team: Option<String>,
    /// The only models it may use, comma-separated [default: any]
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    models: Vec<String>,
    /// How long it lasts: 30d, 12h, ... [default: until revoked]
    #[arg(long, value_name = "DURATION")]
    expires: Option<String>,
    /// Its requests' priority (lower is more urgent); a trusted client hint may only lower it.
    #[arg(long, allow_hyphen_values = true)]
    priority: Option<i64>,
    /// The most of its tenant's requests in service while one of this key's is asked.
    #[arg(long, value_name = "N")]
    max_in_service: Option<usize>,
    /// The only networks its TCP callers may come from: 10.0.0.0/8,192.168.1.7 [default: any the
    /// listener allows]
    #[arg(long, value_name = "CIDR,...")]
    allow_from: Option<String>,
    /// A label, K=V (repeatable), shown in lists and given to policies.
    #[arg(long = "label", value_name = "K=V")]
    labels: Vec<String>,
}

impl KeyFields {
    /// As `POST /keys` takes it.
    fn body(self) -> Result<Value, String> {
        let mut label_map = serde_json::Map::new();
        for l in &self.labels {
            let Some((k, v)) = l.split_once('=') else {
                return Err(format!("--label `{l}` is not K=V"));
            };
            label_map.insert(k.to_owned(), json!(v));
        }
        let mut body = json!({ "tenant": self.tenant, "labels": label_map });
        let models: Vec<String> = self.models.into_iter().filter(|m| !m.is_empty()).collect();
        if !models.is_empty() {
            body["models"] = json!(models);
        }
        for (k, v) in [
            ("team", self.team.map(Value::from)),
            ("expires", self.expires.map(Value::from)),
            ("priority", self.priority.map(Value::from)),
            ("max_in_service", self.max_in_service.map(Value::from)),
            ("allow_from", self.allow_from.map(Value::from)),
        ] {
            if let Some(v) = v {
                body[k] = v;
            }
        }
        Ok(body)
    }
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Issue a key to a person or a service. Prints its secret once: hand it over, slotgate keeps
    /// only a digest. Under --client-auth keys the key's tenant names its caller everywhere: in
    /// quotas, the ledger, the queue's fairness, the logs and `top`.
    Create {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(flatten)]
        fields: KeyFields,
        /// Print the JSON slotgate answered.
        #[arg(long)]
        json: bool,
    },
    /// Make a key for the keys file (--keys-file), without a running slotgate: prints its secret
    /// once, then the `[[key]]` entry (its digest, never the secret) to append to the file.
    /// slotgate reads the file again when it changes.
    Mint {
        #[command(flatten)]
        fields: KeyFields,
        /// Print {"id", "secret", "entry"} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Every key: id, tenant, team, models, created, last used, expires, state. Never a secret.
    List {
        #[command(flatten)]
        admin: AdminArgs,
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// One key, as JSON.
    Show {
        #[command(flatten)]
        admin: AdminArgs,
        id: String,
    },
    /// Stop a key now: its next request gets 401.
    Revoke {
        #[command(flatten)]
        admin: AdminArgs,
        id: String,
        /// Print the JSON slotgate answered.
        #[arg(long)]
        json: bool,
    },
    /// A new secret for the key (same id, tenant and quotas); prints it once. The old secret works
    /// until --grace ends.
    Rotate {
        #[command(flatten)]
        admin: AdminArgs,
        id: String,
        /// How long the old secret keeps working: 1h, 10m, 0s [default: 0s]
        #[arg(long, value_name = "DURATION")]
        grace: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

pub fn key(cmd: KeyCommand) -> ExitCode {
    match cmd {
        KeyCommand::Create {
            admin,
            fields,
            json,
        } => {
            let body = match fields.body() {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("slotgate key create: {e}");
                    return ExitCode::from(2);
                }
            };
            call(
                &admin,
                http::Method::POST,
                "/keys",
                Some(body.to_string().into_bytes()),
                |v| secret_shown(v, json, "created"),
            )
        }
        KeyCommand::Mint { fields, json } => mint(fields, json),
        KeyCommand::List {
            admin,
            tenant,
            json,
        } => call(&admin, http::Method::GET, "/keys", None, |v| {
            if json {
                return v.to_string();
            }
            table(v, tenant.as_deref())
        }),
        KeyCommand::Show { admin, id } => call(
            &admin,
            http::Method::GET,
            &format!("/keys/{}", path_part(&id)),
            None,
            |v| serde_json::to_string_pretty(v).unwrap_or_default(),
        ),
        KeyCommand::Revoke { admin, id, json } => call(
            &admin,
            http::Method::POST,
            &format!("/keys/{}/revoke", path_part(&id)),
            Some(b"{}".to_vec()),
            |v| {
                if json {
                    return v.to_string();
                }
                format!(
                    "key {} ({}) revoked at {}: its next request is refused",
                    text(&v["id"]),
                    text(&v["tenant"]),
                    text(&v["revoked"])
                )
            },
        ),
        KeyCommand::Rotate {
            admin,
            id,
            grace,
            json,
        } => {
            let body = match grace {
                Some(g) => json!({ "grace": g }),
                None => json!({}),
            };
            call(
                &admin,
                http::Method::POST,
                &format!("/keys/{}/rotate", path_part(&id)),
                Some(body.to_string().into_bytes()),
                |v| secret_shown(v, json, "rotated"),
            )
        }
    }
}

/// `key mint`: a new key's secret and its keys-file entry, made here.
fn mint(fields: KeyFields, json: bool) -> ExitCode {
    let made = fields
        .body()
        .and_then(|b| serde_json::from_value::<crate::keys::NewKey>(b).map_err(|e| e.to_string()))
        .and_then(|new| {
            crate::keys::issue(new, crate::budgets::wall_ms()).map_err(|e| e.to_string())
        });
    let (record, secret) = match made {
        Ok(m) => m,
        Err(e) => {
            eprintln!("slotgate key mint: {e}");
            return ExitCode::from(2);
        }
    };
    let entry = crate::keys::file::Entry::of(&record).to_toml();
    if json {
        println!(
            "{}",
            json!({ "id": record.id, "tenant": record.tenant, "secret": secret, "entry": entry })
        );
    } else {
        println!(
            "key {} minted for tenant {}\n\n  {secret}\n\nThis secret is shown once: hand it over. \
             Append this entry to the keys file (--keys-file); slotgate reads it again when it changes:\n\n{entry}",
            record.id, record.tenant
        );
    }
    ExitCode::SUCCESS
}

/// A new secret, shown once, with what to do with it.
fn secret_shown(v: &Value, json: bool, what: &str) -> String {
    if json {
        return v.to_string();
    }
    let mut out = format!(
        "key {} {what} for tenant {}",
        text(&v["id"]),
        text(&v["tenant"])
    );
    if let Some(team) = v["team"].as_str() {
        out.push_str(&format!(" (team {})", crate::log::shown::shown(team)));
    }
    if let Some(until) = v["old_secret_until"].as_str() {
        out.push_str(&format!(
            "; the old secret works until {}",
            crate::log::shown::shown(until)
        ));
    }
    out.push_str(&format!(
        "\n\n  {}\n\nThis secret is shown once: slotgate keeps only its digest. Clients send it as \
         `Authorization: Bearer <secret>` or `x-api-key: <secret>`.",
        text(&v["secret"])
    ));
    out
}

fn table(v: &Value, tenant: Option<&str>) -> String {
    let mut out = format!(
        "{:<12}  {:<20}  {:<14}  {:<16}  {:<20}  {:<20}  {:<20}  state\n",
        "id", "tenant", "team", "models", "created", "last used", "expires"
    );
    let mut n = 0;
    for k in v["keys"].as_array().into_iter().flatten() {
        if tenant.is_some_and(|t| k["tenant"].as_str() != Some(t)) {
            continue;
        }
        n += 1;
        let models: Vec<&str> = k["models"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let models = if models.is_empty() {
            "any".to_owned()
        } else {
            models.join(",")
        };
        let or_dash = |v: &Value| match v.as_str() {
            Some(s) => crate::log::shown::shown(s).into_owned(),
            None => "-".to_owned(),
        };
        out.push_str(&format!(
            "{:<12}  {:<20}  {:<14}  {:<16}  {:<20}  {:<20}  {:<20}  {}\n",
            text(&k["id"]),
            text(&k["tenant"]),
            or_dash(&k["team"]),
            crate::log::shown::shown(&models),
            or_dash(&k["created"]),
            or_dash(&k["last_used"]),
            or_dash(&k["expires"]),
            text(&k["state"])
        ));
    }
    out.push_str(&format!("{n} keys"));
    out
}

/// An id as a path segment: only a key id's characters pass, so nothing else reaches the path.
fn path_part(id: &str) -> String {
    id.chars().filter(char::is_ascii_alphanumeric).collect()
}
