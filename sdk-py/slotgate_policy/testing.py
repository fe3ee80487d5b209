"""A native, in-memory stand-in for slotgate's host interfaces (`log`, `clocks`, `state`), so a
policy's unit tests run with `python3 -m unittest` or pytest, outside wasm. The arithmetic is the
host's (the Rust SDK's emulator, `sdk/src/host/emulated.rs`): buckets, sliding windows, calendar
quotas with operators' limits, on a manual clock that moves only when a test says so.

    host = testing.FakeHost().install()     # or: with testing.FakeHost() as host:
    d = app.WitWorld().evaluate("null", testing.evaluation(path="/v1/completions"))
    host.advance_ms(60_000)

install() replaces the functions of the generated modules `wit_world.imports.log`, `.clocks` and
`.state`, so a policy must call them through their module (`state.bucket_take(...)` after
`from wit_world.imports import state`), not hold a function imported by name before the install.

Never import this module from a policy's own code: it is for its tests only."""

import dataclasses
import math
from collections import deque

from componentize_py_types import Err
from wit_world.imports import clocks, log, state, types

from . import periods
from ._records import build
from .identity import CALLER_HEADER

# The wall clock at monotonic 0, and the default `now_unix_ms` of evaluation(): the Rust SDK's.
WALL_START_MS = 1_800_000_000_000
# What the host accepts as a key or log message, in bytes; a longer key traps.
MAX_HOST_STRING = 4096

_INTERFACES = {
    log: ("log",),
    clocks: ("monotonic_ms", "wall_ms"),
    state: (
        "bucket_take",
        "bucket_refund",
        "bucket_level",
        "window_add",
        "quota_take",
        "quota_refund",
        "quota_level",
        "quota_limit",
        "quota_reset_ms",
        "event",
    ),
}

_installed = None


class HostTrap(Exception):
    """What the host would turn into a trap: the policy fails, and `on_error` decides."""


@dataclasses.dataclass
class _Bucket:
    level: float
    updated_ms: int
    # As the last call gave it: an operator's new quota limit moves the level by the difference.
    capacity: float


class FakeHost:
    """The host's state for one test: create one per test (or call reset()) for a clean slate."""

    def __init__(self):
        self.reset()
        self._saved = None

    def reset(self):
        """Forgets every bucket, window, quota limit, log line and event; the clocks go back to
        monotonic 0 and WALL_START_MS."""
        self.now_ms = 0
        self._wall_offset_ms = 0
        self._buckets = {}
        self._windows = {}
        self._quota_limits = {}
        self.logs = []
        self.events = []

    # --- wiring -----------------------------------------------------------------------------

    def install(self):
        """Puts this fake behind the generated host modules until uninstall(); returns self."""
        global _installed
        if _installed is not None and _installed is not self:
            _installed.uninstall()
        self._saved = {
            (module, name): getattr(module, name)
            for module, names in _INTERFACES.items()
            for name in names
        }
        for module, name in self._saved:
            setattr(module, name, getattr(self, name))
        _installed = self
        return self

    def uninstall(self):
        """Puts back what install() replaced."""
        global _installed
        if self._saved is None:
            return
        for (module, name), fn in self._saved.items():
            setattr(module, name, fn)
        self._saved = None
        if _installed is self:
            _installed = None

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.uninstall()

    # --- the test's controls --------------------------------------------------------------------

    def advance_ms(self, ms: int):
        """Moves both clocks forward: buckets refill, windows age, quota windows pass."""
        self.now_ms += max(ms, 0)

    def set_wall_ms(self, unix_ms: int):
        """Sets the wall clock (and so the quota windows); advance_ms() moves it on from there."""
        self._wall_offset_ms = unix_ms - WALL_START_MS - self.now_ms

    def set_quota_limit(self, key: str, period: str, limit):
        """Sets (or, None, removes) an operator's limit for a quota, as the quota admin API does:
        the current window keeps what it used, so what is left moves by the difference."""
        bucket, _ = self._quota_window(key, period, 0)
        if limit is None:
            self._quota_limits.pop((key, period), None)
            return
        b = self._buckets.get(bucket)
        if b is not None:
            b.level += limit - b.capacity
            b.capacity = limit
        self._quota_limits[(key, period)] = limit

    def take_logs(self):
        """The `(level, message)` pairs logged since the last call."""
        out, self.logs = self.logs, []
        return out

    def take_events(self):
        """The events counted since the last call."""
        out, self.events = self.events, []
        return out

    # --- interface `log` ----------------------------------------------------------------------

    def log(self, level, message: str) -> None:
        self.logs.append((level, message.encode()[:MAX_HOST_STRING].decode(errors="ignore")))

    # --- interface `clocks` -------------------------------------------------------------------

    def monotonic_ms(self) -> int:
        return self.now_ms

    def wall_ms(self) -> int:
        return WALL_START_MS + self.now_ms + self._wall_offset_ms

    # --- interface `state` --------------------------------------------------------------------

    def bucket_take(self, key, capacity, refill_per_sec, amount) -> float:
        _check_key(key)
        return self._take(key, capacity, refill_per_sec, amount)

    def bucket_refund(self, key, capacity, refill_per_sec, amount) -> float:
        _check_key(key)
        return self._refund(key, capacity, refill_per_sec, amount)

    def bucket_level(self, key, capacity, refill_per_sec) -> float:
        _check_key(key)
        return self._level(key, capacity, refill_per_sec)

    def window_add(self, key, window_ms, amount) -> int:
        _check_key(key)
        w = self._windows.setdefault(key, _Window())
        while w.events and self.now_ms - w.events[0][0] >= max(window_ms, 0):
            w.total -= w.events.popleft()[1]
        if amount:
            w.events.append((self.now_ms, amount))
            w.total += amount
        return w.total

    def quota_take(self, key, period, limit, amount) -> float:
        limit = self.quota_limit(key, period, limit)
        bucket, (_, end) = self._quota_window(key, period, 0)
        if self._take(bucket, limit, 0.0, amount) == 0.0:
            return 0.0
        if amount > limit:
            return math.inf
        return max((end - self.wall_ms()) / 1000, 0.001)

    def quota_refund(self, key, period, limit, amount, at_unix_ms) -> float:
        limit = self.quota_limit(key, period, limit)
        bucket, (_, end) = self._quota_window(key, period, at_unix_ms)
        # A window that has ended keeps what it used: a late refund cannot feed the next one.
        if end <= self.wall_ms():
            return self._level(bucket, limit, 0.0)
        return self._refund(bucket, limit, 0.0, amount)

    def quota_level(self, key, period, limit) -> float:
        limit = self.quota_limit(key, period, limit)
        bucket, _ = self._quota_window(key, period, 0)
        return self._level(bucket, limit, 0.0)

    def quota_limit(self, key, period, limit) -> float:
        _check_key(key)
        return self._quota_limits.get((key, period), limit)

    def quota_reset_ms(self, period) -> int:
        return self._quota_window("", period, 0)[1][1]

    def event(self, name) -> None:
        if not (0 < len(name) <= 64 and all(c in _EVENT_CHARS for c in name)):
            raise HostTrap(f"event name `{name[:80]}`: use [a-z0-9_], at most 64 bytes")
        self.events.append(name)

    # --- internals ----------------------------------------------------------------------------

    def _take(self, key, capacity, refill_per_sec, amount) -> float:
        b = self._bucket(key, capacity, refill_per_sec)
        if b.level >= amount:
            b.level -= amount
            return 0.0
        if refill_per_sec <= 0 or amount > capacity:
            return math.inf
        return (amount - b.level) / refill_per_sec

    def _refund(self, key, capacity, refill_per_sec, amount) -> float:
        b = self._bucket(key, capacity, refill_per_sec)
        b.level = min(b.level + amount, capacity)
        return b.level

    def _level(self, key, capacity, refill_per_sec) -> float:
        b = self._buckets.get(key)
        if b is None:
            return capacity
        return _refilled(b.level, (self.now_ms - b.updated_ms) / 1000, capacity, refill_per_sec)

    def _bucket(self, key, capacity, refill_per_sec) -> _Bucket:
        """The bucket `key`, created full and refilled up to now."""
        b = self._buckets.setdefault(key, _Bucket(capacity, self.now_ms, capacity))
        b.capacity = capacity
        b.level = _refilled(b.level, (self.now_ms - b.updated_ms) / 1000, capacity, refill_per_sec)
        b.updated_ms = self.now_ms
        return b

    def _quota_window(self, key, period, at_unix_ms):
        """The bucket of the window of `period` holding `at_unix_ms` (now when 0), and the window.
        A bad period is the WIT's `err`, which componentize-py raises as Err."""
        at = at_unix_ms or self.wall_ms()
        try:
            start, end = periods.window(period, at)
            span, zone = periods.parse_period(period)
        except ValueError as e:
            raise Err(str(e)) from None
        canonical = span if zone is None else f"{span}@{zone}"
        # The host's bucket name (calendar.rs, quota_bucket): control characters keep it apart
        # from any key a policy chooses.
        return f"\x01quota\x01{canonical}\x01{start}\x01{key}", (start, end)


@dataclasses.dataclass
class _Window:
    events: deque = dataclasses.field(default_factory=deque)
    total: int = 0


_EVENT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


def _check_key(key):
    if len(key.encode()) > MAX_HOST_STRING:
        raise HostTrap(f"host string of {len(key.encode())} bytes (limit {MAX_HOST_STRING})")


def _refilled(level, elapsed_seconds, capacity, refill_per_sec):
    return min(level + elapsed_seconds * max(refill_per_sec, 0.0), capacity)


# --- inputs ---------------------------------------------------------------------------------------


def request(*, caller="anonymous", **fields) -> types.Request:
    """A request as the host builds it: a POST to `/v1/chat/completions` over TCP with no key, an
    empty prompt and an idle queue of 8, with `fields` in its place. `headers` may be a dict,
    `queue` a dict of QueueState fields, `peer` a dict of Peer fields. `caller` is the identity the
    host named (its header `x-slotgate-caller`); a test states it, as the host would have named
    the request's key, uid or tenant."""
    defaults = {"method": "POST", "path": "/v1/chat/completions"}
    fields = {**defaults, **fields}
    headers = fields.get("headers", [])
    if isinstance(headers, dict):
        headers = list(headers.items())
    fields["headers"] = [*headers, (CALLER_HEADER, caller)]
    queue = fields.get("queue", {})
    if isinstance(queue, dict):
        fields["queue"] = build(types.QueueState, fill_scalars=True, **{"capacity": 8, **queue})
    if isinstance(fields.get("peer"), dict):
        fields["peer"] = build(types.Peer, fill_scalars=True, **fields["peer"])
    return build(types.Request, fill_scalars=True, **fields)


def evaluation(req=None, *, earlier=None, now_unix_ms=None, **request_fields) -> types.Evaluation:
    """An `evaluate` input: `req` (else request(**request_fields)), `earlier` (a dict of
    Earlier fields, default: no policy before this one) and `now_unix_ms` (default: the installed
    fake's wall clock, else WALL_START_MS)."""
    if req is None:
        req = request(**request_fields)
    elif request_fields:
        raise TypeError("give a request or its fields, not both")
    if not isinstance(earlier, types.Earlier):
        earlier = build(types.Earlier, fill_scalars=True, **(earlier or {}))
    return types.Evaluation(request=req, earlier=earlier, now_unix_ms=_now(now_unix_ms))


def completion(req=None, *, decision=None, **fields) -> types.Completion:
    """An `on-complete` input: `req` (default: request()), `decision` (an Allow record, or an
    allow() decision; default: allowed unchanged), answered 200 `ok` with no usage, the whole
    chain having allowed it; `fields` set the rest (`completion_tokens=...`)."""
    if decision is None:
        decision = build(types.Allow)
    elif isinstance(decision, types.Decision_Allow):
        decision = decision.value
    elif isinstance(decision, types.Decision_Deny):
        raise TypeError("on-complete is told only of requests the policy allowed")
    defaults = {"chain_allowed": True, "status": 200, "outcome": "ok"}
    fields = {**defaults, **fields}
    fields.setdefault("evaluated_unix_ms", _now(None))
    return build(
        types.Completion,
        fill_scalars=True,
        request=req if req is not None else request(),
        decision=decision,
        **fields,
    )


def _now(now_unix_ms):
    if now_unix_ms is not None:
        return now_unix_ms
    return _installed.wall_ms() if _installed is not None else WALL_START_MS
