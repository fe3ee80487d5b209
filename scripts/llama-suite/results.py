"""Reads a pytest JUnit XML report and prints one line per test:
`OUTCOME<TAB>NODE_ID<TAB>REFUSED<TAB>PATHS`, OUTCOME one of passed, failed, skipped. NODE_ID is
pytest's own (`unit/test_basic.py::test_x[param]`), with any new line in a parameter written `\\n`
so a line is a test. From slotgate's access log lines in the test's captured output
(`request outcome=... status=403 method=GET path=/slots`), comma-separated: REFUSED, the paths it
refused with 403 (the evidence that a failure is one of slotgate's protections); PATHS, every path
it answered. The access lines are read from the test's captured output and, given LOG_DIR, from
the file the launcher kept of slotgate's output for the test (`LOG_DIR/<sha1 of NODE_ID>.log`),
which loses none of them.

usage: results.py REPORT.xml [LOG_DIR]
"""
import hashlib
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

# A value is bare, or a JSON string when it holds a space, a quote or a control character
# (docs/observability.md#logs).
ACCESS = re.compile(
    r'slotgate::access: request outcome=\S+ status=(\d+) method=\S+ path=("(?:[^"\\]|\\.)*"|\S+)'
)


def unquoted(value):
    return json.loads(value) if value.startswith('"') else value


def main():
    root = ET.parse(sys.argv[1]).getroot()
    logs = sys.argv[2] if len(sys.argv) > 2 else None
    for case in root.iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        raw = f"{module}::{case.get('name', '')}"
        node = raw.replace("\n", "\\n")
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        output = "".join(child.text or "" for child in case if child.tag in ("system-out", "system-err"))
        if logs:
            kept = os.path.join(logs, hashlib.sha1(raw.encode()).hexdigest() + ".log")
            if os.path.exists(kept):
                with open(kept, errors="replace") as f:
                    output += f.read()
        answered = [(status, unquoted(path)) for status, path in ACCESS.findall(output)]
        refused = sorted({path for status, path in answered if status == "403"})
        paths = sorted({path for _, path in answered})
        print(f"{outcome}\t{node}\t{','.join(refused)}\t{','.join(paths)}")


if __name__ == "__main__":
    main()
