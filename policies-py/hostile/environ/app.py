"""Hostile fixture: reads the environment and reports how many variables it saw."""

import os

import wit_world
from wit_world.imports import types

from slotgate_policy import forbidden, settings_ok


class WitWorld(wit_world.WitWorld):
    def validate_settings(self, settings: str) -> types.SettingsVerdict:
        return settings_ok()

    def evaluate(self, settings: str, input: types.Evaluation) -> types.Decision:
        try:
            count = len(os.environ)
        except Exception as e:
            return forbidden(f"environ failed: {type(e).__name__}: {e}")
        return forbidden(f"saw {count} environment variables")

    def on_complete(self, settings: str, completion: types.Completion) -> None:
        pass
