"""A policy's answers: decisions and settings verdicts, as the WIT's generated records.

Each helper takes the record's other fields by keyword (`allow(cost=120, tenant="team-a")`,
`forbidden("no", rate_limits=...)`), under their Python names (`cap_max_tokens`, ...)."""

from wit_world.imports import types

from ._records import build


def allow(**fields) -> types.Decision:
    """Admit the request; every field left out changes nothing."""
    return types.Decision_Allow(build(types.Allow, **fields))


def deny(status: int, message: str, **fields) -> types.Decision:
    """Refuse the request with `status` (the host accepts 403 and 429) and a message for the
    client."""
    return types.Decision_Deny(build(types.Deny, status=status, message=message, **fields))


def forbidden(message: str, **fields) -> types.Decision:
    """A 403: this request will never be admitted as it is."""
    return deny(403, message, **fields)


def too_many_requests(message: str, retry_after_seconds=None, **fields) -> types.Decision:
    """A 429: try again later, after `retry_after_seconds` when known."""
    return deny(429, message, retry_after_seconds=retry_after_seconds, **fields)


def quota_exceeded(message: str, retry_after_seconds: int, **fields) -> types.Decision:
    """A 429 for a spent quota (`quota_exceeded`), not to be retried by the client's SDK before
    `retry_after_seconds` (the window's end): retrying at once could only be refused again."""
    return too_many_requests(
        message, retry_after_seconds, reason="quota_exceeded", should_retry=False, **fields
    )


def is_allowed(decision: types.Decision) -> bool:
    """Whether `decision` admits the request."""
    return isinstance(decision, types.Decision_Allow)


def settings_ok(**fields) -> types.SettingsVerdict:
    """What `validate-settings` returns for usable settings, asking the host for nothing unless
    `fields` say so (`needs_prompt_tokens=True`, ...). For unusable settings it raises
    `componentize_py_types.Err(message)`: that is how componentize-py returns a WIT `result`'s
    error."""
    return build(types.SettingsVerdict, **fields)
