"""Request guard (Python, policies v2): refuses endpoints and models that are not allowed and prompts
that are too large, caps (or refuses) `max_tokens`, and isolates tenants' prompt caches. A port of
the Rust example policies/request-guard: the same settings, decisions and messages."""

from dataclasses import dataclass, field, fields
from typing import List, Optional

import wit_world
from componentize_py_types import Err
from wit_world.imports import types

from slotgate_policy import allow, forbidden, kept, load_settings, prompt_tokens_best, settings_ok


@dataclass
class Settings:
    # The most tokens a request may generate.
    max_tokens: Optional[int] = None
    # What a larger `max_tokens` gets: "cap" lowers it to the limit, "deny" refuses (403).
    over_max_tokens: str = "cap"
    # Largest prompt, in characters.
    max_prompt_chars: Optional[int] = None
    # Largest prompt, in tokens as llama-server counts them. Setting it makes slotgate count every
    # prompt before the chain decides (see `needs_prompt_tokens`): about 1-2 ms more to the first
    # token of a request that would otherwise be forwarded at once.
    max_prompt_tokens: Optional[int] = None
    # Paths that are served (empty: all but `denied_paths`). `/x*` matches every path under `/x`.
    allowed_paths: List[str] = field(default_factory=list)
    # Paths that are refused, checked first.
    denied_paths: List[str] = field(default_factory=list)
    # Models that may be asked for by name (empty: any). A request naming none is let through:
    # llama-server then answers with the model it has loaded.
    allowed_models: List[str] = field(default_factory=list)
    # Force `cache_prompt: false` and strip `id_slot`, so no tenant reuses another's prompt cache
    # or picks its slot.
    cache_isolation: bool = False

    @classmethod
    def parse(cls, text: str) -> "Settings":
        """The settings in `text`, checked as the Rust policy's serde types and `validate` check
        them; raises ValueError with the message the operator sees."""
        raw = load_settings(text)
        known = [f.name for f in fields(cls)]
        for key in raw:
            if key not in known:
                expected = ", ".join(f"`{k}`" for k in known)
                raise ValueError(f"invalid settings: unknown field `{key}`, expected one of {expected}")
        s = cls(**raw)
        for name in ("max_tokens", "max_prompt_chars", "max_prompt_tokens"):
            value = getattr(s, name)
            # bool is an int in Python; JSON's true is not a count.
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"invalid settings: `{name}` must be a non-negative integer")
        if s.over_max_tokens not in ("cap", "deny"):
            raise ValueError(
                f"invalid settings: unknown variant `{s.over_max_tokens}` of `over_max_tokens`, "
                "expected `cap` or `deny`"
            )
        for name in ("allowed_paths", "denied_paths", "allowed_models"):
            value = getattr(s, name)
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise ValueError(f"invalid settings: `{name}` must be a list of strings")
        if type(s.cache_isolation) is not bool:
            raise ValueError("invalid settings: `cache_isolation` must be true or false")

        for bad in s.allowed_paths + s.denied_paths:
            if not bad.startswith("/"):
                raise ValueError(f"path pattern `{bad}` must start with `/`")
        for bad in s.allowed_models:
            if not bad:
                raise ValueError(f"model pattern `{bad}` is empty")
        if s.max_tokens == 0:
            raise ValueError("max_tokens must be positive")
        return s


def matches(pattern: str, value: str) -> bool:
    """Exact match, or a prefix match for a pattern ending in `*`."""
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    return pattern == value


def any_matches(patterns: List[str], value: str) -> bool:
    return any(matches(p, value) for p in patterns)


def decide(s: Settings, r: types.Request) -> types.Decision:
    path = r.path.split("?", 1)[0]
    if any_matches(s.denied_paths, path) or not (
        not s.allowed_paths or any_matches(s.allowed_paths, path)
    ):
        return forbidden(f"{path} is not served here")
    if r.model is not None and not (not s.allowed_models or any_matches(s.allowed_models, r.model)):
        return forbidden(f"model `{r.model}` is not served here")
    if s.max_prompt_chars is not None and r.prompt_chars > s.max_prompt_chars:
        return forbidden(
            f"the prompt has {r.prompt_chars} characters; the limit is {s.max_prompt_chars}"
        )
    tokens = prompt_tokens_best(r)
    if s.max_prompt_tokens is not None and tokens > s.max_prompt_tokens:
        about = "" if r.prompt_tokens is not None else "about "
        return forbidden(
            f"the prompt has {about}{tokens} tokens; the limit is {s.max_prompt_tokens}"
        )
    if (
        s.max_tokens is not None
        and r.max_tokens is not None
        and s.over_max_tokens == "deny"
        and r.max_tokens > s.max_tokens
    ):
        return forbidden(f"max_tokens {r.max_tokens} is over the limit of {s.max_tokens}")
    return allow(
        # Sent even when the request is within the limit or names none, so the host also bounds
        # a request that leaves max_tokens out.
        cap_max_tokens=s.max_tokens,
        disable_prompt_cache=s.cache_isolation,
        strip_id_slot=s.cache_isolation,
    )


# The settings, parsed on an instance's first call and kept for its next ones.
_settings = kept(Settings.parse)


class WitWorld(wit_world.WitWorld):
    def validate_settings(self, settings: str) -> types.SettingsVerdict:
        try:
            s = Settings.parse(settings)
        except ValueError as e:
            raise Err(str(e))
        # A prompt limit in tokens is only as good as the count: with one set, ask for the exact one.
        return settings_ok(needs_prompt_tokens=s.max_prompt_tokens is not None)

    def evaluate(self, settings: str, input: types.Evaluation) -> types.Decision:
        # The host hands over only settings validate_settings accepted; a failure here is a bug,
        # and raising makes the host count it as the policy failing (its `on_error`).
        return decide(_settings(settings), input.request)

    def on_complete(self, settings: str, completion: types.Completion) -> None:
        # Keeps no budgets: validate_settings never asks for completions, so this is not called.
        pass
