//! `slotgate quota …` and `slotgate usage`: the quota admin API and the usage ledger of a running
//! slotgate (docs/quotas.md), from its admin listener. Changes need the admin token; reading, the
//! read-only one will do. Tenants, models and keys are clients' text: every table shows them
//! through `log::shown`, so none of them reaches the operator's terminal as a control sequence.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::admin_client::{AdminArgs, Target};
use crate::log::shown::shown;

/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Every calendar quota in its current window: what it allows, what is used and left.
    List {
        #[command(flatten)]
        admin: AdminArgs,
        /// Only this policy's quotas.
        #[arg(long)]
        policy: Option<String>,
        /// Only this key (as `list` shows it, e.g. `tokens:uid:1000`).
        #[arg(long)]
        key: Option<String>,
        /// Print the JSON slotgate answered instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Set a quota's limit, in place of the policy's, kept across restarts (`none`: the policy's
    /// again). What was used stays used: what is left moves by the difference.
    Set {
        #[command(flatten)]
        target: QuotaTarget,
        /// The new limit, or `none`.
        limit: String,
    },
    /// Give back up to AMOUNT of what the current window used (never above the limit).
    TopUp {
        #[command(flatten)]
        target: QuotaTarget,
        amount: f64,
    },
    /// Make the current window whole again.
    Reset {
        #[command(flatten)]
        target: QuotaTarget,
    },
    /// Grant AMOUNT above the limit, for the current window only: it ends with the window (not
    /// on a fleet).
    Grant {
        #[command(flatten)]
        target: QuotaTarget,
        amount: f64,
    },
}

/// Which quota a change is for.
#[derive(Debug, Args)]
pub struct QuotaTarget {
    #[command(flatten)]
    admin: AdminArgs,
    /// The policy's name (`list` shows it).
    #[arg(long)]
    policy: String,
    /// The quota's key (`list` shows it).
    #[arg(long)]
    key: String,
    /// The quota's period: `day`, `month@Europe/Paris`, ...
    #[arg(long)]
    period: String,
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// First day, `YYYY-MM-DD` (a day of the ledger's zone, `state.usage-zone`) [default: 29
    /// days before --to]
    #[arg(long, conflicts_with = "month")]
    from: Option<String>,
    /// Last day, `YYYY-MM-DD` [default: today]
    #[arg(long, conflicts_with = "month")]
    to: Option<String>,
    /// A whole month, `YYYY-MM`, in place of --from and --to.
    #[arg(long, value_name = "YYYY-MM")]
    month: Option<String>,
    /// Sum by these columns: day, month, tenant, team, key, model [default: every row, by day,
    /// tenant, team, key and model]
    #[arg(long, value_name = "A,B")]
    by: Option<String>,
    /// Only this tenant.
    #[arg(long)]
    tenant: Option<String>,
    /// Only this team.
    #[arg(long)]
    team: Option<String>,
    /// Only this key (its id).
    #[arg(long)]
    key: Option<String>,
    /// Only this model.
    #[arg(long)]
    model: Option<String>,
    /// Show the cost column ([prices] must price the models; otherwise there is none).
    #[arg(long)]
    cost: bool,
    /// Print CSV (the columns of --by, then requests, prompt_tokens, cached_tokens,
    /// completion_tokens and, priced, cost_<currency>).
    #[arg(long, conflicts_with = "json")]
    csv: bool,
    /// Print the JSON slotgate answered.
    #[arg(long)]
    json: bool,
}

pub fn quota(cmd: QuotaCommand) -> ExitCode {
    match cmd {
        QuotaCommand::List {
            admin,
            policy,
            key,
            json,
        } => {
            let query = query(&[("policy", policy.as_deref()), ("key", key.as_deref())]);
            call(
                &admin,
                http::Method::GET,
                &format!("/quotas{query}"),
                None,
                |v| {
                    if json {
                        return v.to_string();
                    }
                    table(v)
                },
            )
        }
        QuotaCommand::Set { target, limit } => {
            let limit = match limit.as_str() {
                "none" | "null" => Value::Null,
                n => match n.parse::<f64>() {
                    Ok(l) if l.is_finite() && l >= 0.0 => json!(l),
                    _ => {
                        eprintln!(
                            "slotgate quota set: `{n}` is not a limit (a number >= 0, or none)"
                        );
                        return ExitCode::from(2);
                    }
                },
            };
            change(&target, "/quotas/set", json!({ "limit": limit }))
        }
        QuotaCommand::TopUp { target, amount } => {
            change(&target, "/quotas/top-up", json!({ "amount": amount }))
        }
        QuotaCommand::Reset { target } => change(&target, "/quotas/reset", json!({})),
        QuotaCommand::Grant { target, amount } => {
            change(&target, "/quotas/grant", json!({ "amount": amount }))
        }
    }
}

pub fn usage(args: UsageArgs) -> ExitCode {
    let format = args.csv.then_some("csv");
    let query = query(&[
        ("from", args.from.as_deref()),
        ("to", args.to.as_deref()),
        ("month", args.month.as_deref()),
        ("by", args.by.as_deref()),
        ("tenant", args.tenant.as_deref()),
        ("team", args.team.as_deref()),
        ("key", args.key.as_deref()),
        ("model", args.model.as_deref()),
        ("format", format),
    ]);
    let path = format!("/usage{query}");
    if args.csv {
        return raw(&args.admin, &path);
    }
    call(&args.admin, http::Method::GET, &path, None, |v| {
        if args.json {
            return v.to_string();
        }
        usage_table(v, args.cost)
    })
}

/// `/usage` as a table: the columns it was summed by, then the counts (and the cost, asked for
/// and priced).
fn usage_table(v: &Value, cost: bool) -> String {
    let by: Vec<&str> = v["by"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let currency = v["currency"].as_str().filter(|_| cost);
    let width = |c: &str| match c {
        "day" => 10,
        "month" => 7,
        "key" => 12,
        _ => 20,
    };
    let mut head: Vec<String> = by
        .iter()
        .map(|c| format!("{c:<w$}", w = width(c)))
        .collect();
    for n in ["requests", "prompt", "cached", "completion"] {
        head.push(format!("{n:>10}"));
    }
    if let Some(c) = currency {
        head.push(format!("{:>12}", format!("cost {c}")));
    }
    let mut out = head.join("  ").trim_end().to_owned() + "\n";
    let line = |r: &Value, first: &[String]| {
        let mut cells = first.to_vec();
        for n in [
            "requests",
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
        ] {
            cells.push(format!("{:>10}", r[n]));
        }
        if currency.is_some() {
            cells.push(format!("{:>12.6}", r["cost"].as_f64().unwrap_or(0.0)));
        }
        cells.join("  ")
    };
    for r in v["rows"].as_array().into_iter().flatten() {
        let first: Vec<String> = by
            .iter()
            .map(|c| {
                let t = text(&r[*c]);
                let t = if t.is_empty() { "-".into() } else { t };
                format!("{t:<w$}", w = width(c))
            })
            .collect();
        out.push_str(&line(r, &first));
        out.push('\n');
    }
    let mut first = vec![format!(
        "{:<w$}",
        "total",
        w = by.first().map_or(5, |c| width(c))
    )];
    first.extend(
        by.iter()
            .skip(1)
            .map(|c| format!("{:<w$}", "", w = width(c))),
    );
    out.push_str(&line(&v["total"], &first));
    out
}

fn change(t: &QuotaTarget, path: &str, mut body: Value) -> ExitCode {
    body["policy"] = json!(t.policy);
    body["key"] = json!(t.key);
    body["period"] = json!(t.period);
    call(
        &t.admin,
        http::Method::POST,
        path,
        Some(body.to_string().into_bytes()),
        |v| {
            format!(
                "{} {} ({}): {} left of {}",
                text(&v["policy"]),
                text(&v["key"]),
                text(&v["period"]),
                number(&v["left"], "all (not used this window)"),
                number(&v["limit"], "the policy's limit")
            )
        },
    )
}

fn table(v: &Value) -> String {
    let mut out = format!(
        "{:<12}  {:<32}  {:<18}  {:>12}  {:>12}  {:>12}  {:<20}  set by\n",
        "policy", "key", "period", "limit", "used", "left", "window ends"
    );
    for q in v["quotas"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<12}  {:<32}  {:<18}  {:>12}  {:>12}  {:>12}  {:<20}  {}\n",
            text(&q["policy"]),
            text(&q["key"]),
            text(&q["period"]),
            number(&q["limit"], "-"),
            number(&q["used"], "-"),
            number(&q["left"], "-"),
            text(&q["window_end"]),
            text(&q["limit_set_by"])
        ));
    }
    out.push_str(&format!("{} quotas", v["count"]));
    out
}

/// A string of the answer as a table shows it: control characters escaped.
pub(super) fn text(v: &Value) -> std::borrow::Cow<'_, str> {
    shown(v.as_str().unwrap_or(""))
}

fn number(v: &Value, none: &str) -> String {
    v.as_f64()
        .map_or_else(|| none.to_owned(), |n| format!("{n:.0}"))
}

pub(super) fn query(params: &[(&str, Option<&str>)]) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in params {
        if let Some(v) = v {
            q.append_pair(k, v);
        }
    }
    match q.finish() {
        s if s.is_empty() => s,
        s => format!("?{s}"),
    }
}

/// One call; a 2xx JSON answer is printed through `show`, anything else is an error (exit 1;
/// 2 for bad arguments).
pub(super) fn call(
    admin: &AdminArgs,
    method: http::Method,
    path: &str,
    body: Option<Vec<u8>>,
    show: impl FnOnce(&Value) -> String,
) -> ExitCode {
    match answer(admin, method, path, body) {
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => {
                println!("{}", show(&v));
                ExitCode::SUCCESS
            }
            Err(e) => fail(&format!("{path} answered no JSON: {e}")),
        },
        Err((code, e)) => {
            eprintln!("slotgate: {e}");
            code
        }
    }
}

/// A call whose body is printed line by line as it came (CSV), but for control characters,
/// which slotgate's CSV never holds.
fn raw(admin: &AdminArgs, path: &str) -> ExitCode {
    match answer(admin, http::Method::GET, path, None) {
        Ok(bytes) => {
            for line in String::from_utf8_lossy(&bytes).lines() {
                println!("{}", shown(line));
            }
            ExitCode::SUCCESS
        }
        Err((code, e)) => {
            eprintln!("slotgate: {e}");
            code
        }
    }
}

fn answer(
    admin: &AdminArgs,
    method: http::Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<bytes::Bytes, (ExitCode, String)> {
    let target = Target::new(admin).map_err(|e| (ExitCode::from(2), e))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| (ExitCode::FAILURE, e.to_string()))?;
    let (status, bytes) = runtime
        .block_on(target.call(method, path, body, CALL_TIMEOUT))
        .map_err(|e| {
            (
                ExitCode::FAILURE,
                format!("cannot reach {}: {e}", admin.admin),
            )
        })?;
    if (200..300).contains(&status) {
        return Ok(bytes);
    }
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    let hint = match status {
        401 if target.bearer.is_none() => " (give --admin-token-file)",
        403 => " (a change needs the admin token, not the read-only one)",
        _ => "",
    };
    Err((
        ExitCode::FAILURE,
        format!("{path} answered {status}: {}{hint}", shown(&message)),
    ))
}

fn fail(e: &str) -> ExitCode {
    eprintln!("slotgate: {e}");
    ExitCode::FAILURE
}
