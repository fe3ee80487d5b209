//! `GET /usage`: the usage ledger (requests that reached llama-server and the tokens they used,
//! per UTC day, tenant and model) over a range of days, as JSON or CSV.
//!
//! `?from=YYYY-MM-DD&to=YYYY-MM-DD` (both included; by default the last 30 days to today),
//! `&tenant=T`, `&model=M`, `&format=csv` (or `Accept: text/csv`). The names in a CSV are a
//! client's: each cell is made safe to open (`log::shown::csv_cell`: no formula, one row a line).

use http::{header, HeaderMap, HeaderValue, Response};
use serde_json::json;

use crate::log::shown::csv_cell;
use crate::policy::state::wall_ms;
use crate::respond::{self, Body};
use crate::state::App;
use crate::store::ledger::day_of;

/// Days shown when the request names none.
const DEFAULT_DAYS: u32 = 30;

pub fn usage(app: &App, query: Option<&str>, headers: &HeaderMap) -> Response<Body> {
    let param = |name: &str| {
        form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let today = day_of(wall_ms());
    let to = match param("to").map(|d| parse_day(&d)).transpose() {
        Ok(d) => d.unwrap_or(today),
        Err(e) => return bad(&e),
    };
    let from = match param("from").map(|d| parse_day(&d)).transpose() {
        Ok(d) => d.unwrap_or(to.saturating_sub(DEFAULT_DAYS - 1)),
        Err(e) => return bad(&e),
    };
    if from > to {
        return bad("from is after to");
    }
    let (tenant, model) = (param("tenant"), param("model"));
    let rows = match app
        .ledger
        .read(from, to, tenant.as_deref(), model.as_deref())
    {
        Ok(rows) => rows,
        Err(e) => {
            return respond::json(
                500,
                &json!({"error": {"code": "state_error", "message": e.to_string(), "type": "api_error"}}),
            )
        }
    };
    let csv = param("format").as_deref() == Some("csv")
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/csv"));
    if csv {
        let mut out = String::from("day,tenant,model,requests,prompt_tokens,completion_tokens\n");
        for (day, t, m, u) in &rows {
            out.push_str(&format!(
                "{},{},{},{},{},{}\n",
                date(*day),
                csv_cell(t),
                csv_cell(m),
                u.requests,
                u.prompt_tokens,
                u.completion_tokens
            ));
        }
        let mut resp = Response::new(respond::full(out));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/csv; charset=utf-8"),
        );
        return resp;
    }
    let (mut requests, mut prompt, mut completion) = (0, 0, 0);
    let list: Vec<serde_json::Value> = rows
        .iter()
        .map(|(day, t, m, u)| {
            requests += u.requests;
            prompt += u.prompt_tokens;
            completion += u.completion_tokens;
            json!({
                "day": date(*day),
                "tenant": t,
                "model": m,
                "requests": u.requests,
                "prompt_tokens": u.prompt_tokens,
                "completion_tokens": u.completion_tokens,
            })
        })
        .collect();
    respond::json(
        200,
        &json!({
            "from": date(from),
            "to": date(to),
            "rows": list,
            "total": {"requests": requests, "prompt_tokens": prompt, "completion_tokens": completion},
        }),
    )
}

/// `YYYY-MM-DD` as days since the epoch.
fn parse_day(s: &str) -> Result<u32, String> {
    let d: jiff::civil::Date = s
        .parse()
        .map_err(|e| format!("`{s}` is not a date (YYYY-MM-DD): {e}"))?;
    let ms = d
        .to_zoned(jiff::tz::TimeZone::UTC)
        .map_err(|e| e.to_string())?
        .timestamp()
        .as_millisecond();
    Ok(day_of(ms))
}

fn date(day: u32) -> String {
    jiff::Timestamp::from_second(i64::from(day) * 86_400)
        .map(|t| t.strftime("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

fn bad(message: &str) -> Response<Body> {
    respond::json(
        400,
        &json!({"error": {"code": "invalid_request", "message": message, "type": "invalid_request_error"}}),
    )
}
