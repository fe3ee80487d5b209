//! The access line: the line tracing-subscriber prints for the same event (text or JSON, checked
//! by a test), built without its field visitors. In text, a value that is not plain is quoted as a
//! JSON string with everything that could end it, the field or the line escaped: a client's header
//! can neither add a field nor write a line of its own.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use super::shown::hidden;
use crate::config::LogFormat;

/// One field of a line: a string (quoted and escaped in JSON) or a number.
pub enum Field<'a> {
    Str(&'a str),
    Num(u64),
    Int(i64),
    /// An address, written as a string.
    Addr(std::net::SocketAddr),
    /// Money in billionths of its currency, written as a number with six decimals.
    Money(u64),
}

/// `nanos` billionths as a decimal number with six places (`0.001700`).
fn money(out: &mut Vec<u8>, nanos: u64) {
    let micros = (nanos + 500) / 1000;
    let _ = write!(out, "{}.{:06}", micros / 1_000_000, micros % 1_000_000);
}

/// Appends an INFO line of `target` with `message` and `fields` (those `None` left out), in the
/// format tracing-subscriber prints it, with `now` as its time.
pub fn info_line(
    out: &mut Vec<u8>,
    format: LogFormat,
    now: SystemTime,
    target: &str,
    message: &str,
    fields: &[(&str, Option<Field<'_>>)],
) {
    match format {
        LogFormat::Json => {
            out.extend_from_slice(b"{\"timestamp\":\"");
            timestamp(out, now);
            out.extend_from_slice(b"\",\"level\":\"INFO\",\"message\":");
            json_str(out, message);
            for (name, value) in fields {
                let Some(value) = value else { continue };
                out.push(b',');
                json_str(out, name);
                out.push(b':');
                match value {
                    Field::Str(s) => json_str(out, s),
                    Field::Num(n) => {
                        out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes())
                    }
                    Field::Int(n) => {
                        out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes())
                    }
                    Field::Addr(a) => {
                        let _ = write!(out, "\"{a}\"");
                    }
                    Field::Money(n) => money(out, *n),
                }
            }
            out.extend_from_slice(b",\"target\":");
            json_str(out, target);
            out.extend_from_slice(b"}\n");
        }
        LogFormat::Text => {
            timestamp(out, now);
            out.extend_from_slice(b"  INFO ");
            out.extend_from_slice(target.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(message.as_bytes());
            for (name, value) in fields {
                let Some(value) = value else { continue };
                out.push(b' ');
                out.extend_from_slice(name.as_bytes());
                out.push(b'=');
                match value {
                    Field::Str(s) => text_str(out, s),
                    Field::Num(n) => {
                        out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes())
                    }
                    Field::Int(n) => {
                        out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes())
                    }
                    // Digits, dots, colons and brackets (a scope id is a number): always plain.
                    Field::Addr(a) => {
                        let _ = write!(out, "{a}");
                    }
                    Field::Money(n) => money(out, *n),
                }
            }
            out.push(b'\n');
        }
    }
}

/// `s` as a JSON string, escaping beyond JSON's minimum: every [`hidden`] character but the space
/// (DEL, C1, the line separators and bidi overrides too), so a line shows what it holds and a
/// terminal showing it is not driven by it. Any JSON parser reads it back.
fn json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    // Field names and most values need no escape: copied as they are.
    if s.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    let mut rest = s;
    while let Some(at) = rest.find(|c: char| matches!(c, '"' | '\\') || (c != ' ' && hidden(c))) {
        out.extend_from_slice(&rest.as_bytes()[..at]);
        let c = rest[at..].chars().next().unwrap_or_default();
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            // Every hidden character is in the Basic Multilingual Plane: four hex digits hold it.
            c => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
        }
        rest = &rest[at + c.len_utf8()..];
    }
    out.extend_from_slice(rest.as_bytes());
    out.push(b'"');
}

/// A text line's value: bare when plain (`key=value`), else quoted as a JSON string. A plain value
/// is not empty and has no space, `"`, `\\`, `=` or [`hidden`] character, so it ends at the next
/// space and is one `logfmt` token.
fn text_str(out: &mut Vec<u8>, s: &str) {
    let plain = !s.is_empty()
        && s.chars().all(|c| match c {
            '!'..='~' => !matches!(c, '"' | '\\' | '='),
            c => !c.is_ascii() && !hidden(c),
        });
    if plain {
        out.extend_from_slice(s.as_bytes());
    } else {
        json_str(out, s);
    }
}

/// The fields of a text line as [`info_line`] writes them, each value unquoted; `None` when the
/// line is not one line, or not fields after its message. (For the fuzz target and tests: a line
/// that reads back to exactly the fields written has no field or line a value added.)
#[cfg(any(test, feature = "fuzzing"))]
pub fn text_fields(line: &str) -> Option<Vec<(String, String)>> {
    let line = line.strip_suffix('\n')?;
    if line.contains('\n') {
        return None;
    }
    // `<time>  INFO <target>: <message>`, then ` name=value` each.
    let (_, rest) = line.split_once(": ")?;
    let mut rest = rest.find(' ').map_or("", |at| &rest[at..]);
    let mut fields = Vec::new();
    while let Some(field) = rest.strip_prefix(' ') {
        let (name, value) = field.split_once('=')?;
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            return None;
        }
        let (value, after) = if value.starts_with('"') {
            // To the first `"` no backslash escapes.
            let bytes = value.as_bytes();
            let mut at = 1;
            while *bytes.get(at)? != b'"' {
                at += if bytes[at] == b'\\' { 2 } else { 1 };
            }
            let quoted = value.get(..=at)?;
            (
                serde_json::from_str::<String>(quoted).ok()?,
                &value[at + 1..],
            )
        } else {
            let end = value.find(' ').unwrap_or(value.len());
            if end == 0 {
                return None;
            }
            (value[..end].to_owned(), &value[end..])
        };
        fields.push((name.to_owned(), value));
        rest = after;
    }
    rest.is_empty().then_some(fields)
}

/// RFC 3339 in UTC with microseconds, as tracing-subscriber's `SystemTime` prints it.
fn timestamp(out: &mut Vec<u8>, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    if !(0..=9999).contains(&y) {
        let _ = write!(out, "{y:04}-{m:02}-{d:02}T");
    } else {
        digits(out, y as u32, 4);
        out.push(b'-');
        digits(out, m, 2);
        out.push(b'-');
        digits(out, d, 2);
        out.push(b'T');
    }
    // Digit by digit: `write!` with its padding cost more than the rest of an access line.
    digits(out, (rem / 3600) as u32, 2);
    out.push(b':');
    digits(out, (rem / 60 % 60) as u32, 2);
    out.push(b':');
    digits(out, (rem % 60) as u32, 2);
    out.push(b'.');
    digits(out, since.subsec_micros(), 6);
    out.push(b'Z');
}

/// The last `width` decimal digits of `n`, zero-padded.
fn digits(out: &mut Vec<u8>, mut n: u32, width: usize) {
    let start = out.len();
    out.resize(start + width, b'0');
    for slot in out[start..].iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_423), (2025, 12, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        let mut out = Vec::new();
        timestamp(
            &mut out,
            UNIX_EPOCH + Duration::from_micros(1_764_547_200_123_456),
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "2025-12-01T00:00:00.123456Z"
        );
    }

    #[test]
    fn strings_read_back_as_they_went_in_and_hide_nothing() {
        for s in [
            "",
            "plain",
            "q\"uote",
            "back\\slash",
            "tab\t",
            "nl\n",
            "\u{1}",
            "\u{7f}",
            "\u{9b}31m",
            "rtl\u{202e}",
            "é ü 日本",
        ] {
            let mut ours = Vec::new();
            json_str(&mut ours, s);
            assert_eq!(serde_json::from_slice::<String>(&ours).unwrap(), s);
            let text = String::from_utf8(ours.clone()).unwrap();
            assert!(!text.contains(|c| c != ' ' && hidden(c)), "{text}");
            // What serde_json writes, where that hides nothing.
            let theirs = serde_json::to_string(s).unwrap();
            if !theirs.contains(|c| c != ' ' && hidden(c)) && !s.contains('\u{1}') {
                assert_eq!(text, theirs, "{s:?}");
            }
        }
    }

    /// What tracing-subscriber prints for the same event, in the format slotgate sets up.
    fn via_tracing(format: LogFormat, path: &str) -> String {
        #[derive(Clone, Default)]
        struct Capture(Arc<Mutex<Vec<u8>>>);
        impl Write for Capture {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let capture = Capture::default();
        let sink = capture.clone();
        let builder = tracing_subscriber::fmt().with_writer(move || sink.clone());
        let emit = || {
            tracing::info!(
                target: "slotgate::access",
                outcome = %"ok",
                status = 200u16,
                path = %path,
                priority = -3i64,
                tenant = None::<tracing::field::DisplayValue<&str>>,
                total_ms = 7u64,
                "request"
            )
        };
        match format {
            LogFormat::Json => {
                tracing::subscriber::with_default(builder.json().flatten_event(true).finish(), emit)
            }
            LogFormat::Text => {
                tracing::subscriber::with_default(builder.with_ansi(false).finish(), emit)
            }
        }
        let out = capture.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_access_line_is_the_one_tracing_prints() {
        // tracing prints a text value as it is; slotgate's equals it for a plain value.
        for (format, path) in [
            (LogFormat::Json, "/v1/chat \"q\""),
            (LogFormat::Text, "/v1/chat"),
        ] {
            let theirs = via_tracing(format, path);
            let mut ours = Vec::new();
            info_line(
                &mut ours,
                format,
                SystemTime::now(),
                "slotgate::access",
                "request",
                &[
                    ("outcome", Some(Field::Str("ok"))),
                    ("status", Some(Field::Num(200))),
                    ("path", Some(Field::Str(path))),
                    ("priority", Some(Field::Int(-3))),
                    ("tenant", None),
                    ("total_ms", Some(Field::Num(7))),
                ],
            );
            let ours = String::from_utf8(ours).unwrap();
            // The same line but for the time it was made.
            let skip = |s: &str| s.replacen(|c: char| c.is_ascii_digit(), "0", usize::MAX);
            assert_eq!(skip(&ours), skip(&theirs), "{format:?}");
        }
    }

    fn text(fields: &[(&str, Option<Field<'_>>)]) -> String {
        let mut out = Vec::new();
        let format = LogFormat::Text;
        info_line(
            &mut out,
            format,
            UNIX_EPOCH,
            "slotgate::access",
            "request",
            fields,
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn plain_values_stay_bare_and_the_rest_are_json_strings() {
        for (value, shown) in [
            ("uid:1000", "uid:1000"),
            ("/v1/chat/completions", "/v1/chat/completions"),
            ("été", "été"),
            ("", r#""""#),
            ("model not allowed", r#""model not allowed""#),
            ("a=b", r#""a=b""#),
            (r#"say "hi""#, r#""say \"hi\"""#),
            (r"C:\x", r#""C:\\x""#),
            ("a\nb\r\tc", r#""a\nb\r\tc""#),
            ("\u{1b}[31m\u{7f}\u{85}", r#""\u001b[31m\u007f\u0085""#),
            ("\u{2028}\u{202e}\u{a0}", r#""\u2028\u202e\u00a0""#),
        ] {
            let line = text(&[("tenant", Some(Field::Str(value)))]);
            assert_eq!(
                line,
                format!(
                    "1970-01-01T00:00:00.000000Z  INFO slotgate::access: request tenant={shown}\n"
                )
            );
            let back = text_fields(&line).unwrap();
            assert_eq!(back, [("tenant".to_owned(), value.to_owned())], "{line}");
        }
    }

    /// Issue 46's two forged lines: a newline in Codex's `parent_thread_id` wrote a whole access
    /// line, and spaces in `X-Session-Id` added fields.
    #[test]
    fn a_value_cannot_add_a_field_or_a_line() {
        let fake = "x\n2026-01-01T00:00:00.000000Z  INFO slotgate::access: request outcome=ok status=200 tenant=admin";
        let spaced = "s outcome=ok status=200 tenant=x";
        let line = text(&[
            ("outcome", Some(Field::Str("quota_exceeded"))),
            ("status", Some(Field::Num(429))),
            ("tenant", Some(Field::Str("uid:1000"))),
            ("session", Some(Field::Str(spaced))),
            ("parent_agent", Some(Field::Str(fake))),
            ("peer_addr", Some(Field::Addr("[::1]:80".parse().unwrap()))),
            ("priority", Some(Field::Int(-3))),
        ]);
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        let back = text_fields(&line).unwrap();
        let want: Vec<(String, String)> = [
            ("outcome", "quota_exceeded"),
            ("status", "429"),
            ("tenant", "uid:1000"),
            ("session", spaced),
            ("parent_agent", fake),
            ("peer_addr", "[::1]:80"),
            ("priority", "-3"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
        assert_eq!(back, want, "{line}");
    }
}
