"""``judge run --junit PATH``: the run as JUnit XML, the format CI systems read test results in.

One test suite, ``judge``: a case ``run complete`` (failed when the run stopped before every
unit was judged, with the reason), a case per threshold check (failed when breached, or when
it could not be evaluated and fails the run; skipped when it could not be evaluated and does
not), and a case per engine verdict (the sentence saying which engine is better; always
passed: a comparison is information, a threshold is a rule). Written with the standard
library's ElementTree, atomically.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from judge.data.lines import write_atomic
from judge.report.status import describe_check
from judge.report.summary import Summary
from judge.schema import printable

__all__ = ["write_junit"]


def _case(suite: ET.Element, group: str, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=f"judge.{group}", name=printable(name))


def junit_xml(summary: Summary) -> bytes:
    """The summary as a JUnit XML document."""
    suite = ET.Element("testsuite", name="judge")
    run = summary.run
    case = _case(suite, "run", "run complete")
    if run is not None and run.status != "complete":
        ET.SubElement(case, "failure", message=printable(f"incomplete: {run.reason or 'stopped'}"))
    for check in summary.thresholds.checks:
        where = f" ({check.engine})" if check.engine else ""
        case = _case(suite, "thresholds", f"{check.check}{where}")
        if not check.ok:  # one that could not be evaluated and fails the run fails here too
            said = "breached" if check.evaluated else "not evaluated, counted as breached"
            ET.SubElement(case, "failure", message=printable(f"{said}: {describe_check(check)}"))
        elif not check.evaluated:
            message = printable(f"not evaluated: {describe_check(check)}")
            ET.SubElement(case, "skipped", message=message)
    for line in summary.verdict:
        name = line.split(":", 1)[0] if not line.startswith("Trust:") else "trust"
        case = _case(suite, "verdict", name)
        ET.SubElement(case, "system-out").text = printable(line)
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
    suite.set("skipped", str(sum(c.find("skipped") is not None for c in cases)))
    suite.set("errors", "0")
    document: bytes = ET.tostring(suite, encoding="utf-8", xml_declaration=True)
    return document


def write_junit(path: str | Path, summary: Summary) -> Path:
    """Write :func:`junit_xml` to ``path`` atomically (its folder made if missing). An
    OSError names the path; what it means is the caller's to say (after a paid run:
    incomplete, cli/main.py; its folder is checked before the run pays)."""
    return write_atomic(path, junit_xml(summary))
