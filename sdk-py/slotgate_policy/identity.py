"""Who sent a request, as the host names it: slotgate decides the caller's identity once per
request and gives it to every policy in its header `x-slotgate-caller` (docs/policy-abi.md); a
policy only reads it, so policies in any language agree on whose budget is whose."""

import re

from wit_world.imports import types

ANONYMOUS = "anonymous"

# The request headers policies see that name a caller on behalf of a router in front (LiteLLM calls
# with one key for all its callers and forwards theirs): what a `tenant_header` setting may name.
TENANT_HEADERS = ("x-tenant", "openai-organization", "openai-project")

_HASHED_KEY = re.compile(r"sha256:[0-9a-f]{64}")

# Where the host lists the tenant it named the caller (`--client-auth keys`, docs/keys.md): contract
# 2.0.0 has no field for it, and a client cannot send a header of this name to a policy.
TENANT_NAMED_HEADER = "x-slotgate-tenant"

# Where the host gives the caller's identity, always: contract 2.0.0 has no field for it.
CALLER_HEADER = "x-slotgate-caller"


def identity(request: types.Request) -> str:
    """The caller's identity as the host named it, a stable key for settings and host state: the
    tenant slotgate named, else the API key's hash (`sha256:<hex>`), else `uid:<n>` of the
    Unix-socket peer, else `anonymous`."""
    return header(request, CALLER_HEADER) or ANONYMOUS


def header(request: types.Request, name: str):
    """The value of the request header `name` (lower-case), or None. The WIT sends headers as a
    list of pairs; slotgate sends each name once."""
    for key, value in request.headers:
        if key == name:
            return value
    return None


def check_tenant_header(name: str) -> None:
    """Raises ValueError unless `name` is one of TENANT_HEADERS (a `tenant_header` setting)."""
    if name not in TENANT_HEADERS:
        raise ValueError(
            f"tenant_header `{name}` is not a header policies see; "
            f"use one of {', '.join(TENANT_HEADERS)}"
        )


def tenant_key(request: types.Request, tenant_header=None) -> str:
    """Whom a budget or quota is kept for: `header:<value>` of `tenant_header` when the request
    carries it (not empty), else its identity(). Any client that reaches slotgate can set the
    header: use it only when a router in front is the only caller."""
    value = header(request, tenant_header) if tenant_header else None
    if value:
        return f"header:{value}"
    return identity(request)


def prompt_tokens_best(request: types.Request) -> int:
    """The exact prompt tokens when slotgate counted them, else the estimate."""
    if request.prompt_tokens is not None:
        return request.prompt_tokens
    return request.prompt_tokens_estimate


def is_hashed_key(s: str) -> bool:
    """Whether `s` has the shape of a hashed API key, `sha256:` and 64 lower-case hex digits.
    Settings that list raw keys never match (the host hashes every key): validate them with this."""
    return _HASHED_KEY.fullmatch(s) is not None
