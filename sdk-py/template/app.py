"""{{name}}: a slotgate policy in Python (policies v2: a WebAssembly component of the world
`slotgate:policy/policy` in wit/policy.wit).

An instance starts from the state the build snapshot took after importing this module, so a module
first imported during a call is not found: import everything at the top. It may serve several calls
of one caller, never another caller's (docs/policies.md, "Isolation"): wrap settings parsing in
`kept(...)` to parse them once per instance, and keep what must last (budgets, counters) in the
host, through `wit_world.imports.state`, not in module globals."""

import wit_world
from componentize_py_types import Err
from wit_world.imports import types

from slotgate_policy import allow, load_settings, settings_ok


class WitWorld(wit_world.WitWorld):
    def validate_settings(self, settings: str) -> types.SettingsVerdict:
        """Checks the operator's settings (JSON text, `null` when none) once, at load. Raising
        Err(message) refuses them, and the operator sees the message."""
        try:
            load_settings(settings)
        except ValueError as e:
            raise Err(str(e))
        return settings_ok()

    def evaluate(self, settings: str, input: types.Evaluation) -> types.Decision:
        """Decides one request: allow(...) or forbidden(...), too_many_requests(...), ..."""
        return allow()

    def on_complete(self, settings: str, completion: types.Completion) -> None:
        """Told how a request this policy allowed ended, when validate_settings returned
        settings_ok(wants_completions=True): settle budgets here."""
