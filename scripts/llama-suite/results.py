"""Reads a pytest JUnit XML report and prints one line per test: `OUTCOME<TAB>NODE_ID`, OUTCOME one of
passed, failed, skipped. NODE_ID is pytest's own (`unit/test_basic.py::test_x[param]`), with any
new line in a parameter written `\\n` so a line is a test.

usage: results.py REPORT.xml
"""
import sys
import xml.etree.ElementTree as ET


def main():
    root = ET.parse(sys.argv[1]).getroot()
    for case in root.iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        node = f"{module}::{case.get('name', '')}".replace("\n", "\\n")
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        print(f"{outcome}\t{node}")


if __name__ == "__main__":
    main()
