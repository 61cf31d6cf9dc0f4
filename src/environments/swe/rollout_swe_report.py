"""Rollout Service's pytest plugin for the SWE environment: every test's outcome by its exact node id.

Loaded with `-p rollout_swe_report` (through PYTEST_ADDOPTS and PYTHONPATH, so it reaches pytest however the
test command starts it). It writes JSON to $ROLLOUT_SWE_REPORT at the end of the session:

    {"version": 1, "exitstatus": 1, "tests": {"tests/test_x.py::test_y[a b]": "passed", ...},
     "collect_errors": [{"nodeid": "tests/test_z.py", "message": "..."}]}

Statuses: passed, failed, error (setup or teardown failed), skipped, xfail, xpass. A test reported more than once
(setup, call, teardown; subtests) keeps its worst outcome.

The channel to the grader ($ROLLOUT_SWE_CHANNEL=3,4): fd 4 carries a one-time nonce (read once at import, before any
code of the repository runs: nobody can read it after us), fd 3 goes straight to the grader outside the sandbox,
where nothing written can be taken back. On fd 3 the plugin writes "ROLLOUT-SWE <nonce> started <pid>" at import
(pytest started) and, once, "ROLLOUT-SWE <nonce> report <sha256> <bytes>" when it has written the report, then
closes it. The grader takes the report file only when its hash is that one: code that rewrites or deletes the file
afterwards (atexit, pytest_unconfigure, a process left running) is caught, and so is a second report line.
Why a plugin and not junit XML or -rA lines: node ids come straight from pytest, unmangled, parametrized ids with
spaces, brackets and "::" included; junit XML rewrites them into classname/name and -rA lines append " - reason".
Standard library only; pytest >= 3.
"""

import hashlib
import json
import os

_REPORT = os.environ.get("ROLLOUT_SWE_REPORT")
# Popped, so that processes started later (xdist workers, the tests' own subprocesses) never read fds 3 and 4.
_CHANNEL = os.environ.pop("ROLLOUT_SWE_CHANNEL", None)
_RANK = {"skipped": 0, "xfail": 1, "passed": 2, "xpass": 2, "failed": 3, "error": 4}
_tests = {}
_collect_errors = []
_nonce = None


def _read_nonce():
    data = b""
    try:
        while len(data) < 128 and not data.endswith(b"\n"):
            chunk = os.read(4, 128)
            if not chunk:
                break
            data += chunk
        os.close(4)
        os.fstat(3)
    except OSError:
        return None
    nonce = data.decode("ascii", "replace").strip()
    return nonce if nonce.isalnum() else None


def _send(message):
    os.write(3, ("ROLLOUT-SWE %s %s\n" % (_nonce, message)).encode("ascii"))


if _REPORT and _CHANNEL == "3,4":
    _nonce = _read_nonce()
    if _nonce:
        _send("started %d" % os.getpid())


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
    global _nonce
    if not _REPORT or not _nonce or hasattr(session.config, "workerinput"):
        return
    data = json.dumps({"version": 1, "exitstatus": int(exitstatus), "tests": _tests, "collect_errors": _collect_errors[:50]}).encode("ascii")
    partial = _REPORT + ".partial"
    with open(partial, "wb") as out:
        out.write(data)
    os.replace(partial, _REPORT)
    _send("report %s %d" % (hashlib.sha256(data).hexdigest(), len(data)))
    # One report per session: what writes to the channel after this is not the plugin.
    os.close(3)
    _nonce = None
