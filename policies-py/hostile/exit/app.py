"""Hostile fixture: calls `sys.exit` in evaluate, for a request of the model `HOSTILE`; any other is allowed, so the
load-time canary passes and the policy serves."""

import sys

import wit_world
from wit_world.imports import types

from slotgate_policy import allow, settings_ok


class WitWorld(wit_world.WitWorld):
    def validate_settings(self, settings: str) -> types.SettingsVerdict:
        return settings_ok()

    def evaluate(self, settings: str, input: types.Evaluation) -> types.Decision:
        if input.request.model != "HOSTILE":
            return allow()
        sys.exit(3)

    def on_complete(self, settings: str, completion: types.Completion) -> None:
        pass
