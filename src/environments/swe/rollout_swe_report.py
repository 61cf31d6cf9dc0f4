"""Rollout Service's pytest plugin for the SWE environment: every test's outcome by its exact node id.

Loaded with `-p rollout_swe_report` (through PYTEST_ADDOPTS and PYTHONPATH, so it reaches pytest however the
test command starts it). It writes JSON to $ROLLOUT_SWE_REPORT at the end of the session:

    {"version": 1, "exitstatus": 1, "tests": {"tests/test_x.py::test_y[a b]": "passed", ...},
     "collect_errors": [{"nodeid": "tests/test_z.py", "message": "..."}], "tampered": []}

tampered: test sources ($ROLLOUT_SWE_PROTECTED, NUL-separated paths relative to $ROLLOUT_SWE_ROOT; the .py files among
them) changed while pytest ran, as checked before each is imported (its cached bytecode too), for a conftest.py pytest
loads that was not there, and at the end.

Statuses: passed, failed, error (setup or teardown failed), skipped, xfail, xpass, xfail_by_code. A test reported more
than once (setup, call, teardown; subtests) keeps its worst outcome.

xfail_by_code: an imperative xfail (`pytest.xfail()`, its exception raised) with a frame on its way up from code the
agent's patch changed (the files listed NUL-separated in $ROLLOUT_SWE_PATCHED, relative to $ROLLOUT_SWE_ROOT) or from
code with no file (exec, compile): SWE-bench counts an xfail as passing, so the code under test declaring its own test
an expected failure would pass it without fixing anything. The tests' own expected failures (a marker; pytest.xfail()
in the test, a helper, a fixture of the image or the test patch) stay xfail.

The channel to the grader ($ROLLOUT_SWE_CHANNEL=3,4): fd 4 carries a one-time nonce (read once at import, before any
code of the repository runs: nobody can read it after us), fd 3 goes straight to the grader outside the sandbox,
where nothing written can be taken back. On fd 3 the plugin writes "ROLLOUT-SWE <nonce> started <pid>" at import
(pytest started) and, once, "ROLLOUT-SWE <nonce> report <sha256> <bytes>" when it has written the report, then
closes it. The grader takes the report file only when its hash is that one: code that rewrites or deletes the file
afterwards (atexit, pytest_unconfigure, a process left running) is caught, and so is a second report line.
Why a plugin and not junit XML or -rA lines: node ids come straight from pytest, unmangled, parametrized ids with
spaces, brackets and "::" included; junit XML rewrites them into classname/name and -rA lines append " - reason".
Standard library and pytest only; pytest >= 3.
"""

import hashlib
import json
import os

_REPORT = os.environ.get("ROLLOUT_SWE_REPORT")
# Popped, so that processes started later (xdist workers, the tests' own subprocesses) never read fds 3 and 4.
_CHANNEL = os.environ.pop("ROLLOUT_SWE_CHANNEL", None)
_RANK = {"skipped": 0, "xfail": 1, "passed": 2, "xpass": 2, "failed": 3, "xfail_by_code": 3, "error": 4}
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

import pytest  # noqa: E402 (already imported by the pytest that loads this plugin; after the nonce all the same)


def _read_patched():
    # Read at import, before any code of the repository runs. Not popped: pytest-xdist workers need them too.
    root, listing = os.environ.get("ROLLOUT_SWE_ROOT"), os.environ.get("ROLLOUT_SWE_PATCHED")
    paths = set()
    if not root or not listing:
        return paths
    with open(listing, "rb") as names:
        for name in names.read().split(b"\0"):
            if name:
                path = os.path.join(os.fsencode(root), name)
                paths.add(os.path.abspath(path))
                paths.add(os.path.realpath(path))
    return paths


_patched = _read_patched()


def _patched_code(filename):
    """Whether a frame's code is the patch's: a file it changed (or under a link it made), or code with no file."""
    if not filename or filename.startswith("<"):
        return not filename.startswith("<frozen ")
    path = os.path.abspath(os.fsencode(filename))
    if os.path.realpath(path) in _patched:
        return True
    while True:
        if path in _patched:
            return True
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent


def _digest(path):
    try:
        with open(path, "rb") as source:
            return hashlib.sha256(source.read()).hexdigest()
    except OSError:
        return None


def _bytecode(path):
    # The cached bytecode Python and pytest's assertion rewriter would load instead of the source: __pycache__/<stem>.*
    head, tail = os.path.split(path)
    cache, stem = os.path.join(head, b"__pycache__"), os.path.splitext(tail)[0] + b"."
    try:
        names = os.listdir(cache)
    except OSError:
        return {}
    return {name: _digest(os.path.join(cache, name)) for name in names if name.startswith(stem)}


def _read_protected():
    # The test sources as they are before any code of the repository runs in this process (see _tampered).
    root, listing = os.environ.get("ROLLOUT_SWE_ROOT"), os.environ.get("ROLLOUT_SWE_PROTECTED")
    sources = {}
    if not root or not listing:
        return sources
    with open(listing, "rb") as names:
        for name in names.read().split(b"\0"):
            if name.endswith(b".py"):
                path = os.path.abspath(os.path.join(os.fsencode(root), name))
                sources[path] = (_digest(path), _bytecode(path))
    return sources


_protected = _read_protected()
_root = os.path.abspath(os.fsencode(os.environ.get("ROLLOUT_SWE_ROOT", "/nonexistent"))) + b"/"
# Test sources (listed test files, the test patch's, their test trees, every conftest.py) changed while pytest ran:
# code under test that rewrites a test file (or its cached bytecode, or adds a conftest.py) before pytest imports it
# made the tests pass without fixing anything. Checked before each import (collection, the import system) and at the
# end; a non-empty list is no result.
_tampered = set()


def _check(filename, importing):
    path = os.path.abspath(os.fsencode(str(filename)))
    known = _protected.get(path)
    if known is None:
        if importing and os.path.basename(path) == b"conftest.py" and path.startswith(_root) and _protected:
            _tampered.add(os.fsdecode(path))  # a conftest.py made while pytest ran
        return
    if _digest(path) != known[0] or (importing and _bytecode(path) != known[1]):
        _tampered.add(os.fsdecode(path))


class _ImportGuard(object):
    """Checks a protected source just before it is imported; finds nothing itself."""

    def find_spec(self, name, path=None, target=None):
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.origin:
                _check(spec.origin, True)
        except Exception:  # a finder of ours must never break an import
            pass
        return None


if _protected:
    import importlib.machinery
    import sys

    sys.meta_path.insert(0, _ImportGuard())


def pytest_collectstart(collector):
    path = getattr(collector, "path", None) or getattr(collector, "fspath", None)
    if path is not None and str(path).endswith(".py"):
        _check(path, True)


def pytest_plugin_registered(plugin, manager):
    # After its import (checked before it by the import guard): a conftest.py made while pytest ran, or changed since.
    filename = getattr(plugin, "__file__", None)
    if isinstance(filename, str) and os.path.basename(filename) == "conftest.py":
        path = os.path.abspath(os.fsencode(filename))
        if _protected and path.startswith(_root) and path not in _protected:
            _tampered.add(os.fsdecode(path))
        _check(filename, False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    excinfo = call.excinfo
    if not hasattr(report, "wasxfail") or excinfo is None or not excinfo.errisinstance(pytest.xfail.Exception):
        return
    # Every frame from the test's call down to the raise: the test's or a helper's, or the patch's on the way.
    tb = excinfo.tb
    while tb is not None:
        if _patched_code(tb.tb_frame.f_code.co_filename):
            report.rollout_xfail_by_code = True  # a plain attribute: kept on the report pytest-xdist sends its controller
            return
        tb = tb.tb_next


def _status(report):
    xfail = hasattr(report, "wasxfail")
    if xfail and getattr(report, "rollout_xfail_by_code", False):
        return "xfail_by_code"
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
    for path in _protected:
        _check(path, False)
    data = json.dumps({"version": 1, "exitstatus": int(exitstatus), "tests": _tests, "collect_errors": _collect_errors[:50], "tampered": sorted(_tampered)[:50]}).encode("ascii")
    partial = _REPORT + ".partial"
    with open(partial, "wb") as out:
        out.write(data)
    os.replace(partial, _REPORT)
    _send("report %s %d" % (hashlib.sha256(data).hexdigest(), len(data)))
    # One report per session: what writes to the channel after this is not the plugin.
    os.close(3)
    _nonce = None
