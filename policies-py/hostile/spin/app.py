"""Hostile fixture: never returns from evaluate, for a request of the model `HOSTILE`; any other is allowed, so the
load-time canary passes and the policy serves."""

import wit_world
from wit_world.imports import types

from slotgate_policy import allow, settings_ok


class WitWorld(wit_world.WitWorld):
    def validate_settings(self, settings: str) -> types.SettingsVerdict:
        return settings_ok()

    def evaluate(self, settings: str, input: types.Evaluation) -> types.Decision:
        if input.request.model != "HOSTILE":
            return allow()
        while True:
            pass

    def on_complete(self, settings: str, completion: types.Completion) -> None:
        pass
