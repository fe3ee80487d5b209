//! `GET /usage`: the usage ledger (requests that reached llama-server, their prompt tokens, how many
//! of those came from llama-server's cache, the tokens generated and, with `[prices]`, their cost)
//! over a range of days of the ledger's zone, as JSON or CSV; row by row, or summed by the columns
//! asked for (`by`).
//!
//! `?from=YYYY-MM-DD&to=YYYY-MM-DD` (both included; by default the last 30 days to today) or
//! `?month=YYYY-MM`; `&tenant=T&team=T&key=ID&model=M` to keep only those; `&by=month,tenant` to
//! sum by those columns (of `day`, `month`, `tenant`, `team`, `key`, `model`; by default every row
//! as kept: day, tenant, team, key, model); `&format=csv` (or `Accept: text/csv`). The names in a
//! CSV are a client's: each cell is made safe to open (`log::shown::csv_cell`: no formula, one row
//! a line).

use std::collections::BTreeMap;

use http::{header, HeaderMap, HeaderValue, Response};
use serde_json::{json, Map, Value};

use crate::budgets::wall_ms;
use crate::config::prices::from_nanos;
use crate::log::shown::csv_cell;
use crate::respond::{self, Body};
use crate::state::App;
use crate::store::ledger::{date_of, day_number, Row, Usage};

/// Days shown when the request names none.
const DEFAULT_DAYS: u32 = 30;

/// The columns rows may be summed by, in the order they are shown.
const COLUMNS: &[&str] = &["day", "month", "tenant", "team", "key", "model"];

pub fn usage(app: &App, query: Option<&str>, headers: &HeaderMap) -> Response<Body> {
    match answer(app, query, headers) {
        Ok(resp) => resp,
        Err(e) => bad(&e),
    }
}

fn answer(app: &App, query: Option<&str>, headers: &HeaderMap) -> Result<Response<Body>, String> {
    let param = |name: &str| {
        form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let today = app.ledger.day_of(wall_ms());
    let (from, to) = match param("month") {
        Some(m) => month_days(&m)?,
        None => {
            let to = param("to")
                .map(|d| parse_day(&d))
                .transpose()?
                .unwrap_or(today);
            let from = param("from")
                .map(|d| parse_day(&d))
                .transpose()?
                .unwrap_or(to.saturating_sub(DEFAULT_DAYS - 1));
            (from, to)
        }
    };
    if from > to {
        return Err("from is after to".into());
    }
    let by: Vec<&'static str> = match param("by") {
        None => vec!["day", "tenant", "team", "key", "model"],
        Some(list) => {
            let mut by = Vec::new();
            for c in list.split(',').map(str::trim).filter(|c| !c.is_empty()) {
                let known = COLUMNS.iter().find(|k| **k == c).ok_or_else(|| {
                    format!("by: `{c}` is not a column; use {}", COLUMNS.join(", "))
                })?;
                by.push(*known);
            }
            by.sort_by_key(|c| COLUMNS.iter().position(|k| k == c));
            by.dedup();
            by
        }
    };
    let only = |name: &str| param(name).filter(|v| !v.is_empty());
    let (tenant, team, key, model) = (only("tenant"), only("team"), only("key"), only("model"));
    let rows = app
        .ledger
        .read(from, to, |w| {
            tenant.as_deref().is_none_or(|t| *w.tenant == *t)
                && team.as_deref().is_none_or(|t| *w.team == *t)
                && key.as_deref().is_none_or(|k| *w.key == *k)
                && model.as_deref().is_none_or(|m| *w.model == *m)
        })
        .map_err(|e| format!("the ledger cannot be read: {e}"))?;
    let summed = sum_by(&rows, &by);
    let priced = app.config.prices.any();
    let csv = param("format").as_deref() == Some("csv")
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/csv"));
    if csv {
        return Ok(csv_answer(
            &summed,
            &by,
            priced,
            &app.config.prices.currency,
        ));
    }
    let mut total = Usage::default();
    let list: Vec<Value> = summed
        .iter()
        .map(|(cells, u)| {
            total.add(u);
            let mut row = Map::new();
            for (c, v) in by.iter().zip(cells) {
                row.insert((*c).to_owned(), json!(v));
            }
            numbers(&mut row, u, priced);
            Value::Object(row)
        })
        .collect();
    let mut t = Map::new();
    numbers(&mut t, &total, priced);
    let mut body = json!({
        "from": date(from),
        "to": date(to),
        "by": by,
        "rows": list,
        "total": t,
    });
    if priced {
        body["currency"] = json!(app.config.prices.currency);
    }
    Ok(respond::json(200, &body))
}

/// The rows summed by the columns `by`, in their order.
fn sum_by(rows: &[Row], by: &[&str]) -> BTreeMap<Vec<String>, Usage> {
    let mut out: BTreeMap<Vec<String>, Usage> = BTreeMap::new();
    for r in rows {
        let cells = by
            .iter()
            .map(|c| match *c {
                "day" => date(r.day),
                "month" => date(r.day).get(..7).unwrap_or_default().to_owned(),
                "tenant" => r.who.tenant.to_string(),
                "team" => r.who.team.to_string(),
                "key" => r.who.key.to_string(),
                _ => r.who.model.to_string(),
            })
            .collect();
        out.entry(cells).or_default().add(&r.usage);
    }
    out
}

fn numbers(row: &mut Map<String, Value>, u: &Usage, priced: bool) {
    row.insert("requests".into(), json!(u.requests));
    row.insert("prompt_tokens".into(), json!(u.prompt_tokens));
    row.insert("cached_tokens".into(), json!(u.cached_tokens));
    row.insert("completion_tokens".into(), json!(u.completion_tokens));
    if priced {
        row.insert("cost".into(), json!(from_nanos(u.cost_nanos)));
    }
}

fn csv_answer(
    summed: &BTreeMap<Vec<String>, Usage>,
    by: &[&str],
    priced: bool,
    currency: &str,
) -> Response<Body> {
    let mut out = by.join(",");
    out.push_str(",requests,prompt_tokens,cached_tokens,completion_tokens");
    if priced {
        out.push_str(&format!(",cost_{}", currency.to_ascii_lowercase()));
    }
    out.push('\n');
    for (cells, u) in summed {
        for c in cells {
            out.push_str(&csv_cell(c));
            out.push(',');
        }
        out.push_str(&format!(
            "{},{},{},{}",
            u.requests, u.prompt_tokens, u.cached_tokens, u.completion_tokens
        ));
        if priced {
            out.push_str(&format!(",{:.6}", from_nanos(u.cost_nanos)));
        }
        out.push('\n');
    }
    let mut resp = Response::new(respond::full(out));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    resp
}

/// `YYYY-MM-DD` as days since the epoch (a civil date: the ledger's days are its zone's).
fn parse_day(s: &str) -> Result<u32, String> {
    let d: jiff::civil::Date = s
        .parse()
        .map_err(|e| format!("`{s}` is not a date (YYYY-MM-DD): {e}"))?;
    days_since_epoch(d)
}

/// The first and last day of the month `YYYY-MM`.
fn month_days(s: &str) -> Result<(u32, u32), String> {
    let first: jiff::civil::Date = format!("{s}-01")
        .parse()
        .map_err(|_| format!("month: `{s}` is not a month (YYYY-MM)"))?;
    let last = first.last_of_month();
    Ok((days_since_epoch(first)?, days_since_epoch(last)?))
}

fn days_since_epoch(d: jiff::civil::Date) -> Result<u32, String> {
    day_number(d).ok_or_else(|| format!("{d} is outside the ledger's calendar"))
}

fn date(day: u32) -> String {
    date_of(day).map(|d| d.to_string()).unwrap_or_default()
}

fn bad(message: &str) -> Response<Body> {
    respond::json(
        400,
        &json!({"error": {"code": "invalid_request", "message": message, "type": "invalid_request_error"}}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_months_read_and_print_back() {
        let d = parse_day("2026-12-07").unwrap();
        assert_eq!(date(d), "2026-12-07");
        let (a, b) = month_days("2026-02").unwrap();
        assert_eq!(
            (date(a), date(b)),
            ("2026-02-01".into(), "2026-02-28".into())
        );
        assert!(month_days("2026-13").is_err());
        assert!(parse_day("yesterday").is_err());
    }
}
