"""Hostile fixture: reads a host file. Allowed only if the read succeeded."""

import wit_world
from wit_world.imports import types

from slotgate_policy import allow, forbidden, settings_ok


class WitWorld(wit_world.WitWorld):
    def validate_settings(self, settings: str) -> types.SettingsVerdict:
        return settings_ok()

    def evaluate(self, settings: str, input: types.Evaluation) -> types.Decision:
        try:
            with open("/etc/passwd") as f:
                text = f.read()
        except Exception as e:
            return forbidden(f"open failed: {type(e).__name__}: {e}")
        return allow(response_headers=[("x-hostile-read-bytes", str(len(text)))])

    def on_complete(self, settings: str, completion: types.Completion) -> None:
        pass
