"""Hostile fixture: connects a TCP socket to 127.0.0.1:9 (discard). Allowed only if it connected."""

# At the top, not in evaluate: componentize-py snapshots the modules imported at build time, and a
# module first imported during a call is looked for on a file system the sandbox does not have
# (the call would then only prove that `socket` is missing, not that the network is closed).
import socket

import wit_world
from wit_world.imports import types

from slotgate_policy import allow, forbidden, settings_ok


class WitWorld(wit_world.WitWorld):
    def validate_settings(self, settings: str) -> types.SettingsVerdict:
        return settings_ok()

    def evaluate(self, settings: str, input: types.Evaluation) -> types.Decision:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect(("127.0.0.1", 9))
        except Exception as e:
            return forbidden(f"connect failed: {type(e).__name__}: {e}")
        return allow(response_headers=[("x-hostile-connected", "127.0.0.1:9")])

    def on_complete(self, settings: str, completion: types.Completion) -> None:
        pass
