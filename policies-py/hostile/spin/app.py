"""Hostile fixture: never returns from evaluate."""

import wit_world
from wit_world.imports import types

from slotgate_policy import settings_ok


class WitWorld(wit_world.WitWorld):
    def validate_settings(self, settings: str) -> types.SettingsVerdict:
        return settings_ok()

    def evaluate(self, settings: str, input: types.Evaluation) -> types.Decision:
        while True:
            pass

    def on_complete(self, settings: str, completion: types.Completion) -> None:
        pass
