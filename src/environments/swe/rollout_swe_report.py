"""Rollout Service's pytest plugin for the SWE environment: every test's outcome by its exact node id.

Loaded with `-p rollout_swe_report` (through PYTEST_ADDOPTS and PYTHONPATH, so it reaches pytest however the
test command starts it). It writes JSON to $ROLLOUT_SWE_REPORT at the end of the session:

    {"version": 1, "exitstatus": 1, "tests": {"tests/test_x.py::test_y[a b]": "passed", ...},
     "collect_errors": [{"nodeid": "tests/test_z.py", "message": "..."}]}

Statuses: passed, failed, error (setup or teardown failed), skipped, xfail, xpass. A test reported more than once
(setup, call, teardown; subtests) keeps its worst outcome. Importing the module writes $ROLLOUT_SWE_REPORT.started,
so the grader can tell "pytest never started" (the eval could not run) from "pytest ran and found nothing".
Why a plugin and not junit XML or -rA lines: node ids come straight from pytest, unmangled, parametrized ids with
spaces, brackets and "::" included; junit XML rewrites them into classname/name and -rA lines append " - reason".
Standard library only; pytest >= 3.
"""

import json
import os

_REPORT = os.environ.get("ROLLOUT_SWE_REPORT")
_RANK = {"skipped": 0, "xfail": 1, "passed": 2, "xpass": 2, "failed": 3, "error": 4}
_tests = {}
_collect_errors = []

if _REPORT:
    with open(_REPORT + ".started", "w") as marker:
        marker.write(str(os.getpid()))


def _status(report):
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            return "xpass" if xfail else "passed"
        if report.skipped:
            return "xfail" if xfail else "skipped"
        return "failed"
    if report.failed:
        return "error"
    if report.skipped:
        return "xfail" if xfail else "skipped"
    return None  # a passing setup or teardown says nothing about the test


def pytest_runtest_logreport(report):
    status = _status(report)
    if status is None:
        return
    previous = _tests.get(report.nodeid)
    if previous is None or _RANK[status] > _RANK[previous]:
        _tests[report.nodeid] = status


def pytest_collectreport(report):
    if report.failed:
        _collect_errors.append({"nodeid": report.nodeid, "message": str(report.longrepr)[-2000:]})


def pytest_sessionfinish(session, exitstatus):
    # pytest-xdist workers load the plugin too; their controller sees every report, so only it writes.
    if not _REPORT or hasattr(session.config, "workerinput"):
        return
    partial = _REPORT + ".partial"
    with open(partial, "w") as out:
        json.dump({"version": 1, "exitstatus": int(exitstatus), "tests": _tests, "collect_errors": _collect_errors[:50]}, out)
    os.replace(partial, _REPORT)
