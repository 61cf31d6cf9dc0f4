# The test harness of HumanEval-format tasks, run inside the sample's sandbox by humaneval-runner.ts as
#   python3 -I -c "<this file>" NONCE        with stdin: {"prompt", "completion", "test", "entry_point"} as JSON
#
# It assembles the solution (the prompt followed by the model's code; when that does not compile and the code
# defines whole functions, the prompt's imports followed by the code), loads it, loads the test, and runs the
# body of check(candidate) one top-level statement at a time: each statement holding an assert is one test, the
# others are set-up. Results are JSON lines "NONCE {...}" on a duplicate of the original stdout; the solution's
# own stdin, stdout and stderr are /dev/null, so nothing it prints can be taken for a result (or flood the pipe).
# Events: ready {total}; result {index, passed, error?}; test_error {error}; done. A test with no result line
# (the program timed out, was killed, or called os._exit) did not pass.
import ast
import json
import os
import sys

_nonce = sys.argv[1]
_payload = json.loads(sys.stdin.read())
_out = os.fdopen(os.dup(1), "w")
_null = os.open(os.devnull, os.O_RDWR)
for _fd in (0, 1, 2):
    os.dup2(_null, _fd)
# Kept before the solution runs, so a solution that patches json or os cannot change how results are written.
_dumps, _write, _flush, _exit = json.dumps, _out.write, _out.flush, os._exit


def _emit(**event):
    _write(_nonce + " " + _dumps(event) + "\n")
    _flush()


def _describe(error):
    try:
        text = str(error)
    except BaseException:
        text = ""
    name = type(error).__name__
    return (name + ": " + text if text else name)[:300]


def _returns_at_top(node):
    """Whether a statement of check's body would return or yield from check itself (not from a nested function)."""
    if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)):
        return True
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        return False
    return any(_returns_at_top(child) for child in ast.iter_child_nodes(node))


def _plan(test):
    """(check's body statements, its parameter name, indexes of the statements that are tests), or None."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check" and len(node.args.args) == 1:
            body = node.body
            tests = [i for i, s in enumerate(body) if any(isinstance(n, ast.Assert) for n in ast.walk(s))]
            if tests and not any(_returns_at_top(s) for s in body):
                return body, node.args.args[0].arg, set(tests)
    return None


def _assemble(prompt, completion):
    joined = prompt + ("" if prompt.endswith("\n") else "\n") + completion + "\n"
    try:
        compile(joined, "solution.py", "exec")
        return joined
    except SyntaxError:
        pass
    imports = [line for line in prompt.splitlines() if line.startswith(("import ", "from "))]
    return "\n".join(imports + [completion]) + "\n"


def _main():
    test, entry = _payload["test"], _payload["entry_point"]
    plan = _plan(test)
    total = len(plan[2]) if plan else 1
    _emit(kind="ready", total=total)

    def fail_all(error):
        for i in range(total):
            _emit(kind="result", index=i, passed=False, error=error)
        _emit(kind="done")
        _exit(0)

    scope = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(_assemble(_payload["prompt"], _payload["completion"]), "solution.py", "exec"), scope)
    except BaseException as error:
        fail_all("the solution did not load: " + _describe(error))
    candidate = scope.get(entry)
    if not callable(candidate):
        fail_all("the solution defines no function " + entry)
    try:
        exec(compile(test, "test.py", "exec"), scope)
    except BaseException as error:
        _emit(kind="test_error", error=_describe(error))
        _exit(0)

    if plan is None:
        try:
            scope["check"](candidate)
            _emit(kind="result", index=0, passed=True)
        except BaseException as error:
            _emit(kind="result", index=0, passed=False, error=_describe(error))
        _emit(kind="done")
        _exit(0)

    body, parameter, tests = plan
    names = dict(scope)
    names[parameter] = candidate
    setup_error = None
    index = 0
    for i, statement in enumerate(body):
        if setup_error is None:
            try:
                exec(compile(ast.Module(body=[statement], type_ignores=[]), "test.py", "exec"), names)
                error = None
            except BaseException as caught:
                error = _describe(caught)
            if error is not None and i not in tests:
                setup_error = error
        else:
            error = "not run: a set-up statement failed: " + setup_error
        if i in tests:
            _emit(kind="result", index=index, passed=error is None, **({"error": error} if error else {}))
            index += 1
    _emit(kind="done")
    _exit(0)


try:
    _main()
except BaseException as _error:
    _emit(kind="harness_error", error=_describe(_error))
    _exit(3)
