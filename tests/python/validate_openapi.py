"""Validates an OpenAPI document with openapi-spec-validator (pinned in requirements.txt), for
tests/tests/polyglot/openapi_valid.rs.

    "$SLOTGATE_PYTHON" tests/python/validate_openapi.py docs/openapi.json

Prints one JSON object: the validator's version, the OpenAPI version it read the document as, and
each error it finds (its message and where), none when the document is valid.
"""

import json
import sys
from importlib.metadata import version

try:
    from openapi_spec_validator import OpenAPIV31SpecValidator
except ImportError as e:
    sys.exit(f"{sys.argv[0]}: {e}: run it with the venv's Python (scripts/setup-python-clients.sh)")


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        document = json.load(f)
    errors = [
        {"message": e.message, "at": "/".join(str(p) for p in e.absolute_path)}
        for e in OpenAPIV31SpecValidator(document).iter_errors()
    ]
    print(json.dumps({
        "validator": version("openapi-spec-validator"),
        "openapi": document.get("openapi"),
        "errors": errors,
    }))


if __name__ == "__main__":
    main()
