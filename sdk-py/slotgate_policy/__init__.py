"""slotgate's Python policy SDK: helpers over the types componentize-py generates from the WIT
contract (`slotgate policy wit`), never copies of them.

The generated modules (`wit_world`, `componentize_py_types`) are componentize-py's: inside the
component it makes them itself. Natively (a policy's unit tests) they are what `componentize-py
bindings` wrote into `bindings/` beside this package's folder, which is put on the path here when
nothing else provides them, so plain `python3 -m unittest` and pytest find them. The testing module
is for tests only and is not imported here."""

try:
    import wit_world  # noqa: F401  (inside the component, or bindings already on the path)
except ImportError:
    import sys
    from pathlib import Path

    _BINDINGS = Path(__file__).resolve().parent.parent / "bindings"
    if not (_BINDINGS / "wit_world").is_dir():
        raise ImportError(
            f"no WIT bindings in {_BINDINGS}: generate them with `componentize-py -d wit -w policy "
            "bindings bindings` (a project: `./build.sh bindings`; this repository: "
            "`scripts/build-policies-py.sh bindings`)"
        ) from None
    sys.path.insert(0, str(_BINDINGS))

from .decisions import (
    allow,
    deny,
    forbidden,
    is_allowed,
    quota_exceeded,
    settings_ok,
    too_many_requests,
)
from .identity import (
    ANONYMOUS,
    CALLER_HEADER,
    TENANT_HEADERS,
    check_tenant_header,
    header,
    identity,
    is_hashed_key,
    prompt_tokens_best,
    tenant_key,
)
from .periods import parse_period
from .settings import kept, load_settings

__all__ = [
    "ANONYMOUS",
    "CALLER_HEADER",
    "TENANT_HEADERS",
    "allow",
    "check_tenant_header",
    "deny",
    "forbidden",
    "header",
    "identity",
    "is_allowed",
    "is_hashed_key",
    "kept",
    "load_settings",
    "parse_period",
    "prompt_tokens_best",
    "quota_exceeded",
    "settings_ok",
    "tenant_key",
    "too_many_requests",
]
