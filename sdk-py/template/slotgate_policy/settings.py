"""The operator's settings, as `validate-settings` and every other export receive them: JSON
text, `null` when none are configured."""

import json


def load_settings(text: str) -> dict:
    """The settings object; `{}` for `null`, so a policy whose every key is optional needs no
    special case. Raises ValueError for anything but a JSON object or null."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"settings are not JSON: {e}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"settings must be a JSON object, not {type(value).__name__}")
    return value


def kept(parse):
    """`parse` (settings text -> your settings) remembering its last answer. An instance may serve
    several calls of one caller (docs/policies.md, "Isolation") and the text is the same for all of
    them, so with `Settings.parse = kept(...)`-style wrapping it is parsed once per instance instead
    of on every call. Treat what it returns as read-only: the next call gets the same object."""
    last = []

    def parse_kept(text):
        if not last or last[0] != text:
            value = parse(text)
            last[:] = [text, value]
        return last[1]

    return parse_kept
