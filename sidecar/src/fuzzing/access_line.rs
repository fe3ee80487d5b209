//! The `access_line` target: clients' text in the access line (text and JSON) and in the CLI's
//! tables and CSV. A value never adds a field or a line, and reads back as it went in.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::{Duration, UNIX_EPOCH};

use serde_json::Value;

use crate::config::LogFormat;
use crate::log::shown::{csv_cell, hidden, shown};
use crate::log::{info_line, text_fields, Field};

/// The access line's fields, in its order (`pipeline::access`): one value each from the input.
const NAMES: [&str; 28] = [
    "outcome",
    "status",
    "method",
    "path",
    "request_id",
    "priority",
    "tenant",
    "model",
    "queue_wait_ms",
    "deadline_ms",
    "band",
    "session",
    "agent",
    "parent_agent",
    "conversation",
    "shed",
    "reserved_tokens",
    "prompt_tokens",
    "completion_tokens",
    "retry_after",
    "policy",
    "reason",
    "upstream_ms",
    "total_ms",
    "peer_uid",
    "peer_gid",
    "peer_pid",
    "peer_addr",
];

/// A value as the input gives it (a field's `Field` borrows from it).
enum Given {
    Str(String),
    Num(u64),
    Int(i64),
    Addr(SocketAddr),
}

/// Byte 0: bit 0 picks JSON over text, the rest sets the line's time. The rest, cut at each 0xFF
/// (never in UTF-8), is one value per field in order: a part starting 0xFE is a number (decimal
/// digits), 0xFD a signed one (`-` first when negative), 0xFC an address (as text, else made of
/// its bytes), 0xFB an absent field; any other part is text, read as UTF-8 with each bad byte
/// made U+FFFD.
pub fn access_line(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let format = match sel & 1 {
        0 => LogFormat::Text,
        _ => LogFormat::Json,
    };
    let values: Vec<Option<Given>> = rest.split(|&b| b == 0xFF).map(value).collect();
    let fields: Vec<(&str, Option<Field<'_>>)> = NAMES
        .iter()
        .zip(values.iter().map(Some).chain(std::iter::repeat(None)))
        .map(|(name, v)| {
            let field = v.and_then(Option::as_ref).map(|v| match v {
                Given::Str(s) => Field::Str(s),
                Given::Num(n) => Field::Num(*n),
                Given::Int(n) => Field::Int(*n),
                Given::Addr(a) => Field::Addr(*a),
            });
            (*name, field)
        })
        .collect();
    let now = UNIX_EPOCH + Duration::from_secs(u64::from(sel >> 1) * 86_400 * 300);
    let mut out = Vec::new();
    info_line(
        &mut out,
        format,
        now,
        "slotgate::access",
        "request",
        &fields,
    );
    let line = String::from_utf8(out).expect("a line is UTF-8");

    // One line, and nothing in it a reader cannot see for what it is.
    assert_eq!(line.find('\n'), Some(line.len() - 1), "{line:?}");
    let bad = line[..line.len() - 1]
        .chars()
        .find(|&c| c != ' ' && hidden(c));
    assert_eq!(bad, None, "{line:?}");

    let sent: Vec<(&str, &Given)> = NAMES
        .iter()
        .zip(&values)
        .filter_map(|(name, v)| Some((*name, v.as_ref()?)))
        .collect();
    match format {
        LogFormat::Text => {
            let back = text_fields(&line).unwrap_or_else(|| panic!("unreadable: {line:?}"));
            let want: Vec<(String, String)> = sent
                .iter()
                .map(|(name, v)| {
                    let text = match v {
                        Given::Str(s) => s.clone(),
                        Given::Num(n) => n.to_string(),
                        Given::Int(n) => n.to_string(),
                        Given::Addr(a) => a.to_string(),
                    };
                    ((*name).to_owned(), text)
                })
                .collect();
            assert_eq!(back, want, "{line:?}");
        }
        LogFormat::Json => {
            let v: Value = serde_json::from_str(&line).expect("a JSON line");
            let object = v.as_object().expect("an object");
            assert_eq!(object.len(), sent.len() + 4, "{line:?}");
            assert_eq!(v["message"], "request");
            assert_eq!(v["target"], "slotgate::access");
            for (name, sent) in &sent {
                let want = match sent {
                    Given::Str(s) => Value::from(s.as_str()),
                    Given::Num(n) => Value::from(*n),
                    Given::Int(n) => Value::from(*n),
                    Given::Addr(a) => Value::from(a.to_string()),
                };
                assert_eq!(object.get(*name), Some(&want), "{name}: {line:?}");
            }
        }
    }

    for (_, v) in &sent {
        if let Given::Str(s) = v {
            table_and_csv(s);
        }
    }
}

fn value(part: &[u8]) -> Option<Given> {
    // Digits as decimal (any byte counts as one, wrapping), so a seed reads as text.
    let number = |bytes: &[u8]| {
        bytes.iter().fold(0u64, |n, b| {
            n.wrapping_mul(10)
                .wrapping_add(u64::from(b.wrapping_sub(b'0') % 10))
        })
    };
    Some(match part.split_first() {
        Some((0xFB, _)) => return None,
        Some((0xFE, rest)) => Given::Num(number(rest)),
        Some((0xFD, rest)) => match rest.split_first() {
            Some((b'-', digits)) => Given::Int((number(digits) as i64).wrapping_neg()),
            _ => Given::Int(number(rest) as i64),
        },
        Some((0xFC, rest)) => Given::Addr(
            std::str::from_utf8(rest)
                .ok()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| {
                    // Not an address as text: one made of the bytes (port, then v4 or v6).
                    let port = rest
                        .iter()
                        .take(2)
                        .fold(0u16, |p, b| p << 8 | u16::from(*b));
                    let mut ip = [0u8; 16];
                    let octets = rest.get(2..).unwrap_or_default();
                    ip.iter_mut().zip(octets).for_each(|(o, b)| *o = *b);
                    let ip = match octets.len() {
                        0..=4 => IpAddr::from([ip[0], ip[1], ip[2], ip[3]]),
                        _ => IpAddr::V6(Ipv6Addr::from(ip)),
                    };
                    SocketAddr::new(ip, port)
                }),
        ),
        _ => Given::Str(String::from_utf8_lossy(part).into_owned()),
    })
}

/// A client's text in a CLI table and a CSV cell: nothing hidden, one line, no formula.
fn table_and_csv(s: &str) {
    let table = shown(s);
    assert!(!table.contains(|c| c != ' ' && hidden(c)), "{table:?}");
    if !s.contains(|c| c != ' ' && hidden(c)) {
        assert_eq!(table, s);
    }
    let cell = csv_cell(s);
    assert!(!cell.contains(|c| c != ' ' && hidden(c)), "{cell:?}");
    // Unquoted as a spreadsheet reads it, the cell is the shown text, made text by a `'` when
    // it would start a formula.
    let read = match cell.strip_prefix('"') {
        Some(inner) => {
            let inner = inner.strip_suffix('"').expect("a quoted cell ends quoted");
            assert!(!inner.replace("\"\"", "").contains('"'), "{cell:?}");
            inner.replace("\"\"", "\"")
        }
        None => {
            assert!(!cell.contains([',', '"']), "{cell:?}");
            cell.clone()
        }
    };
    let formula = table.starts_with(['=', '+', '-', '@', '\t', '\r']);
    let want = if formula {
        format!("'{table}")
    } else {
        table.into_owned()
    };
    assert_eq!(read, want, "{cell:?}");
}
