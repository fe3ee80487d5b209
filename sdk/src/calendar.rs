//! Calendar windows of the quota host functions: one definition, used by the sidecar and by the
//! SDK's native emulation, so a policy's unit tests see exactly the windows it will see in slotgate.
//!
//! A period is `hour`, `day`, `week` (ISO weeks, from Monday) or `month`, optionally followed by
//! `@` and an IANA time zone (`day@Europe/Paris`); without one it is UTC. A window starts at the
//! period's start in that zone's local time (midnight for a day, where a zone skips midnight the
//! first instant of the day) and ends where the next begins, so a day may last 23 or 25 hours.
//!
//! [`Period::parse`] checks the syntax anywhere (also in a policy's `validate`, on wasm32); the
//! windows themselves need the time zone database and are computed natively only: in the host, or
//! in the SDK's emulation.

use std::fmt;

/// A calendar period, as a quota host function takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    /// Hour, day, week or month.
    pub span: Span,
    /// The IANA time zone, `None` for UTC.
    pub zone: Option<String>,
}

/// How long a [`Period`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Span {
    /// From one full hour to the next.
    Hour,
    /// From midnight to midnight.
    Day,
    /// From Monday midnight to the next (ISO 8601 weeks).
    Week,
    /// From the first of a month at midnight to the first of the next.
    Month,
}

impl Period {
    /// Parses `day`, `week@Europe/Paris`, ... The zone is checked for its form only (an IANA name:
    /// letters, digits, `/`, `_`, `-`, `+`); whether the database knows it is checked where windows
    /// are computed.
    pub fn parse(s: &str) -> Result<Period, String> {
        let (span, zone) = match s.split_once('@') {
            Some((span, zone)) => (span, Some(zone)),
            None => (s, None),
        };
        let span = match span {
            "hour" => Span::Hour,
            "day" => Span::Day,
            "week" => Span::Week,
            "month" => Span::Month,
            other => {
                return Err(format!(
                    "quota period `{other}`: expected hour, day, week or month \
                     (optionally @ and an IANA time zone, as in `day@Europe/Paris`)"
                ))
            }
        };
        let zone = match zone {
            None | Some("UTC") => None,
            Some(z) => {
                let ok = !z.is_empty()
                    && z.len() <= 64
                    && z.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-' | b'+')
                    });
                if !ok {
                    return Err(format!(
                        "quota period `{s}`: `{z}` is not an IANA time zone name"
                    ));
                }
                Some(z.to_owned())
            }
        };
        Ok(Period { span, zone })
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let span = match self.span {
            Span::Hour => "hour",
            Span::Day => "day",
            Span::Week => "week",
            Span::Month => "month",
        };
        match &self.zone {
            Some(z) => write!(f, "{span}@{z}"),
            None => f.write_str(span),
        }
    }
}

/// The host bucket a quota's window is kept in: a bucket with no refill whose capacity is the
/// limit, named by the window's start, so each window starts whole. The control characters keep it
/// apart from any bucket key a policy chooses.
pub fn quota_bucket(key: &str, period: &Period, window_start_ms: i64) -> String {
    format!("\u{1}quota\u{1}{period}\u{1}{window_start_ms}\u{1}{key}")
}

/// The parts of a [`quota_bucket`] name: the key, the period and the window's start; `None` for a
/// plain bucket.
pub fn parse_quota_bucket(name: &str) -> Option<(&str, Period, i64)> {
    let rest = name.strip_prefix("\u{1}quota\u{1}")?;
    let mut parts = rest.splitn(3, '\u{1}');
    let period = Period::parse(parts.next()?).ok()?;
    let start = parts.next()?.parse().ok()?;
    Some((parts.next()?, period, start))
}

/// The window of `period` that holds `unix_ms`: its start and its end (the next window's start),
/// both in Unix milliseconds. Fails on a time zone the database does not know.
#[cfg(not(target_arch = "wasm32"))]
pub fn window(period: &Period, unix_ms: i64) -> Result<(i64, i64), String> {
    use jiff::{civil, tz::TimeZone, Timestamp, ToSpan};

    let zone = match &period.zone {
        None => TimeZone::UTC,
        Some(name) => TimeZone::get(name)
            .map_err(|e| format!("quota period `{period}`: unknown time zone ({e})"))?,
    };
    let at = Timestamp::from_millisecond(unix_ms)
        .map_err(|e| format!("time {unix_ms} ms is out of range: {e}"))?;
    let local = at.to_zoned(zone.clone()).datetime();
    let day = local.date();
    let (start, next): (civil::DateTime, civil::DateTime) = match period.span {
        Span::Hour => {
            let start = day.at(local.hour(), 0, 0, 0);
            (start, start.saturating_add(1.hour()))
        }
        Span::Day => {
            let start = day.at(0, 0, 0, 0);
            (start, start.saturating_add(1.day()))
        }
        Span::Week => {
            let back = i64::from(day.weekday().to_monday_zero_offset());
            let start = day.saturating_sub(back.days()).at(0, 0, 0, 0);
            (start, start.saturating_add(1.week()))
        }
        Span::Month => {
            let start = day.first_of_month().at(0, 0, 0, 0);
            (start, start.saturating_add(1.month()))
        }
    };
    // A local time a zone skips (a spring-forward gap) is its first instant after the gap; one it
    // repeats is its first occurrence: jiff's `compatible` disambiguation.
    let instant = |dt: civil::DateTime| {
        zone.to_ambiguous_zoned(dt)
            .compatible()
            .map(|z| z.timestamp().as_millisecond())
            .map_err(|e| format!("quota period `{period}`: {e}"))
    };
    let (start, end) = (instant(start)?, instant(next)?);
    // An hour that a transition cuts short or stretches still holds `unix_ms`.
    Ok((start.min(unix_ms), end.max(unix_ms + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        s.parse::<jiff::Timestamp>().unwrap().as_millisecond()
    }

    fn win(period: &str, at: &str) -> (i64, i64) {
        window(&Period::parse(period).unwrap(), ms(at)).unwrap()
    }

    #[test]
    fn periods_parse_and_print_back() {
        for s in [
            "hour",
            "day",
            "week",
            "month",
            "day@Europe/Paris",
            "month@America/New_York",
        ] {
            assert_eq!(Period::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(Period::parse("day@UTC").unwrap().to_string(), "day");
        for bad in ["", "days", "Day", "day@", "day@Europe Paris", "minute"] {
            assert!(Period::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn windows_start_and_end_at_the_zones_boundaries() {
        assert_eq!(
            win("day", "2026-12-04T23:59:59.999Z"),
            (ms("2026-12-04T00:00:00Z"), ms("2026-12-05T00:00:00Z"))
        );
        assert_eq!(
            win("day", "2026-12-05T00:00:00Z").0,
            ms("2026-12-05T00:00:00Z"),
            "midnight starts the next day"
        );
        // Paris is UTC+1 in December: its day starts at 23:00 UTC.
        assert_eq!(
            win("day@Europe/Paris", "2026-12-04T23:30:00Z"),
            (ms("2026-12-04T23:00:00Z"), ms("2026-12-05T23:00:00Z"))
        );
        assert_eq!(
            win("hour", "2026-12-04T10:42:00Z"),
            (ms("2026-12-04T10:00:00Z"), ms("2026-12-04T11:00:00Z"))
        );
        // 2026-12-04 is a Friday; ISO weeks start on Monday.
        assert_eq!(
            win("week", "2026-12-04T12:00:00Z"),
            (ms("2026-11-30T00:00:00Z"), ms("2026-12-07T00:00:00Z"))
        );
        assert_eq!(
            win("month", "2026-02-14T12:00:00Z"),
            (ms("2026-02-01T00:00:00Z"), ms("2026-03-01T00:00:00Z"))
        );
    }

    #[test]
    fn a_day_with_a_clock_change_is_23_or_25_hours() {
        // Europe/Paris springs forward on 2026-03-29 and falls back on 2026-10-25.
        let (s, e) = win("day@Europe/Paris", "2026-03-29T12:00:00Z");
        assert_eq!(e - s, 23 * 3_600_000);
        let (s, e) = win("day@Europe/Paris", "2026-10-25T12:00:00Z");
        assert_eq!(e - s, 25 * 3_600_000);
    }

    #[test]
    fn quota_bucket_names_read_back() {
        let p = Period::parse("day@Europe/Paris").unwrap();
        let name = quota_bucket("team\u{1}a", &p, 42);
        assert_eq!(parse_quota_bucket(&name), Some(("team\u{1}a", p, 42)));
        assert_eq!(parse_quota_bucket("team-a"), None);
    }

    #[test]
    fn an_unknown_zone_is_an_error_that_names_it() {
        let p = Period::parse("day@Mars/Olympus_Mons").unwrap();
        let e = window(&p, 0).unwrap_err();
        assert!(e.contains("day@Mars/Olympus_Mons"), "{e}");
    }
}
