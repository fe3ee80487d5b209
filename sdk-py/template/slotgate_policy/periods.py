"""Calendar periods of the quota host functions (the Rust SDK's `calendar.rs`, in Python).

A period is `hour`, `day`, `week` (ISO weeks, from Monday) or `month`, optionally followed by `@`
and an IANA time zone (`day@Europe/Paris`); without one it is UTC. parse_period() checks the form
anywhere, so a policy can validate a period setting inside wasm. window() needs the time zone
database for a zone: the testing fake uses it natively; inside wasm the host computes windows."""

import re
from datetime import datetime, timedelta, timezone

SPANS = ("hour", "day", "week", "month")

_ZONE = re.compile(r"[A-Za-z0-9/_+-]{1,64}")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)


def parse_period(period: str):
    """`(span, zone)` of `period`, zone None for UTC. Raises ValueError with the host's message."""
    span, _, zone = period.partition("@")
    if span not in SPANS:
        raise ValueError(
            f"quota period `{span}`: expected hour, day, week or month "
            "(optionally @ and an IANA time zone, as in `day@Europe/Paris`)"
        )
    if "@" not in period or zone == "UTC":
        return span, None
    if not _ZONE.fullmatch(zone):
        raise ValueError(f"quota period `{period}`: `{zone}` is not an IANA time zone name")
    return span, zone


def window(period: str, unix_ms: int):
    """`(start, end)` in Unix milliseconds of the window of `period` holding `unix_ms`: it starts
    at the period's start in the zone's local time and ends where the next begins (so a day may
    last 23 or 25 hours). Raises ValueError for a bad period or an unknown zone."""
    span, zone = parse_period(period)
    tz = timezone.utc if zone is None else _zone(period, zone)
    local = (_EPOCH + unix_ms * _MS).astimezone(tz).replace(tzinfo=None)
    if span == "hour":
        start = local.replace(minute=0, second=0, microsecond=0)
        following = start + timedelta(hours=1)
    elif span == "day":
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        following = start + timedelta(days=1)
    elif span == "week":
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        start -= timedelta(days=start.weekday())
        following = start + timedelta(days=7)
    else:
        start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        following = (start + timedelta(days=32)).replace(day=1)

    # fold=0 is the host's (jiff's `compatible`) reading of a local time: a time the zone skips
    # is taken with the offset before the gap, one it repeats is its first occurrence.
    def instant(dt):
        return (dt.replace(tzinfo=tz, fold=0) - _EPOCH) // _MS

    # An hour that a transition cuts short or stretches still holds `unix_ms`.
    return min(instant(start), unix_ms), max(instant(following), unix_ms + 1)


def _zone(period, name):
    try:
        from zoneinfo import ZoneInfo

        return ZoneInfo(name)
    except Exception as e:  # ZoneInfoNotFoundError, or no database at all (inside wasm)
        raise ValueError(f"quota period `{period}`: unknown time zone ({e})") from None
