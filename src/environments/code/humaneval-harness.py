# The test harness of HumanEval-format tasks, run inside the sample's sandbox by humaneval-runner.ts as
#   python3 -I -c "<this file>"     with stdin: "L1 L2\n", L1 bytes of {"prompt", "completion", "entry_point"} as
#                                    JSON, L2 bytes of {"test"} as JSON, then the nonce and "\n"
#
# Trust. Code running in a process can do anything that process can (read its memory, /proc/self/cmdline, its
# descriptors, its callers' frames, exit with any status), so nothing inside a process that runs the solution is
# trusted: not a secret, not a channel, not an exit status. Three kinds of process:
#   - the judge (this process): reads the payload, loads the prompt and the task's test code, runs check's body and
#     writes the results. It never runs solution code, and holds the test, the nonce and the result channel (stdout).
#     It makes itself non-dumpable (prctl), so a process of the same uid cannot open its /proc/PID/fd or mem.
#   - the zygote: forked before the judge reads the test and the nonce, so they are never in its memory (nor in its
#     children's); it keeps only a socket to the judge (stdin, stdout and stderr become /dev/null, every other
#     descriptor is closed), compiles the solution once and forks one worker per test, reporting each one's exit.
#   - a worker: loads the solution (the prompt followed by the model's code; when that does not compile and the code
#     defines whole functions, the prompt's imports followed by the code) and answers calls: the judge's `candidate`
#     is a stub that sends the arguments (pickled: judge to worker only) and reads back the return value as data
#     (tagged JSON of None, bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset; anything else is
#     an opaque value equal to nothing) or the name and text of the exception raised.
# So a test passes only when the judge's own assert holds on plain values the judge rebuilt: printing, exiting,
# threads, patching modules or reaching __main__ in the worker change no verdict, and an object overriding __eq__
# arrives as its plain contents (an int subclass as an int, a list subclass as a list, any other object as opaque).
# The residual: the answer itself is the solution's choice, so a solution that finds the expected values elsewhere
# (a file the task left in the sandbox, a guess) is not caught; the judge's non-dumpable state is best effort (no
# ctypes: the judge stays dumpable, and a same-uid process could read its memory where ptrace is allowed).
#
# Tests: check(candidate)'s body runs in the judge one top-level statement at a time: each statement holding an
# assert is one test, the others are set-up (a set-up statement that fails marks the later tests "not run"; the
# statements after the last test belong to it, so one of them that fails fails it). A check
# whose body returns or yields runs whole, as one test. Each test gets a fresh worker (set-up calls before it use the
# same one), so the solution's state does not carry from one test to the next; the statements themselves run in order
# in the judge, as before. Differences from running check in the solution's process: the test code sees the prompt's
# names (its imports and helpers such as HumanEval's `poly`), not the solution's redefinitions of them; arguments are
# copies, so a test cannot observe the solution mutating them; arguments that cannot be pickled fail their test.
# Results are JSON lines "NONCE {...}" on stdout. Events: ready {total}; result {index, passed, error?};
# test_error {error}; harness_error {error}; done. A test with no result line (the time limit) did not pass.
#
# The judge's own failures. The solution's processes run as the judge's uid, so they can signal it and lower its
# resource limits (prlimit(2) needs only the uid, not ptrace access); what cannot be prevented must not pay. A judge
# that dies (SIGKILL, SIGTERM, SIGSTOP until the time limit) leaves its remaining tests without a result: they fail.
# SIGINT, which Python turns into an exception, is ignored. And whatever can fail on the task's side (its prompt, its
# test code, its check) and whatever the judge opens or imports happens before the solution runs (asyncio, for an async
# check only, aside: its import failing fails that check): a broken task is an evaluation failure whatever the solution
# is, and a judge left without descriptors or memory after that fails only calls, inside tests. (Loading the test code
# after the solution let a solution lower the judge's RLIMIT_NOFILE or RLIMIT_AS and turn its reward 0 into "the task's
# test code did not load" or "the harness failed".)
import __future__
import ast
import builtins
import json
import os
import pickle
import signal
import socket
import struct
import sys

_MAX_FRAME = 64 << 20


def _read_exact(fd, n):
    parts, left = [], n
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _read_line(fd):
    """A short line read byte by byte, so that nothing after it is read into this process."""
    line = b""
    while len(line) < 200:
        byte = os.read(fd, 1)
        if byte in (b"", b"\n"):
            break
        line += byte
    return line.decode()


def _send(fd, data):
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _recv(fd):
    """One frame, or None at the end of the stream; raises ValueError past the size bound."""
    header = _read_exact(fd, 4)
    if header is None:
        return None
    (size,) = struct.unpack(">I", header)
    if size > _MAX_FRAME:
        raise ValueError("a frame of %d bytes" % size)
    return _read_exact(fd, size)


def _describe(error):
    try:
        text = str(error)
    except BaseException:
        text = ""
    if isinstance(error, _SolutionError):
        return text[:300]
    name = type(error).__name__
    return (name + ": " + text if text else name)[:300]


class _SolutionError(Exception):
    """Something the solution's process did (or failed to do) during a call; its text is the detail."""


# ---- the zygote and its workers: they never see the test or the nonce ----

def _assemble(prompt, completion):
    joined = prompt + ("" if prompt.endswith("\n") else "\n") + completion + "\n"
    try:
        compile(joined, "solution.py", "exec")
        return joined
    except SyntaxError:
        pass
    imports = [line for line in prompt.splitlines() if line.startswith(("import ", "from "))]
    return "\n".join(imports + [completion]) + "\n"


def _encode(value):
    """The return value as tagged JSON data (run in the worker: an honest value's faithful copy)."""
    if value is None or isinstance(value, bool):
        return bool(value) if value is not None else None
    if isinstance(value, int):
        return {"i": hex(int.__index__(value))}
    if isinstance(value, float):
        return {"f": float.__float__(value)}
    if isinstance(value, complex):
        return {"c": [value.real, value.imag]}
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return {"b": bytes(value).hex()}
    if isinstance(value, list):
        return [_encode(v) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"t": [_encode(v) for v in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"d": [[_encode(k), _encode(v)] for k, v in dict.items(value)]}
    if isinstance(value, frozenset):
        return {"z": [_encode(v) for v in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"s": [_encode(v) for v in set.__iter__(value)]}
    import numbers
    if isinstance(value, numbers.Integral):
        return {"i": hex(int(value))}
    if isinstance(value, numbers.Real):
        return {"f": float(value)}
    return {"o": type(value).__name__[:100]}


def _worker(fd, code, load_error, entry):
    def reply(**message):
        _send(fd, json.dumps(message).encode())

    if code is None:
        reply(load_error=load_error)
        os._exit(0)
    scope = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec(code, scope)
    except BaseException as error:
        reply(load_error=_describe(error))
        os._exit(0)
    function = scope.get(entry)
    if not callable(function):
        reply(missing=True)
        os._exit(0)
    reply(loaded=True)
    while True:
        frame = _recv(fd)
        if frame is None or frame == b"end":
            os._exit(0)
        try:
            args, kwargs = pickle.loads(frame)
            message = {"value": _encode(function(*args, **kwargs))}
        except BaseException as error:
            message = {"raised": [type(error).__name__[:100], _describe(error).partition(": ")[2]]}
        try:
            reply(**message)
        except BaseException as error:
            reply(raised=["", "the return value could not be sent: " + _describe(error)])


def _zygote(fd, solution):
    try:
        code = compile(_assemble(solution["prompt"], solution["completion"]), "solution.py", "exec")
        load_error = None
    except BaseException as error:
        code, load_error = None, _describe(error)
    while True:
        frame = _recv(fd)
        if frame != b"spawn":
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            _worker(fd, code, load_error, solution["entry_point"])
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        _send(fd, json.dumps({"exited": os.waitstatus_to_exitcode(status)}).encode())


# ---- the judge ----

class _Opaque:
    """A returned value of a type that does not cross as data: equal to nothing but itself."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "<%s object>" % self.name


def _decode(data):
    if data is None or isinstance(data, (bool, str)):
        return data
    if isinstance(data, list):
        return [_decode(v) for v in data]
    if not isinstance(data, dict) or len(data) != 1:
        raise ValueError("not a value")
    (tag, v), = data.items()
    if tag == "i" and isinstance(v, str):
        return int(v, 16)
    if tag == "f" and isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if tag == "c" and isinstance(v, list) and len(v) == 2 and all(type(x) in (int, float) for x in v):
        return complex(v[0], v[1])
    if tag == "b" and isinstance(v, str):
        return bytes.fromhex(v)
    if tag in ("t", "s", "z") and isinstance(v, list):
        items = [_decode(x) for x in v]
        return tuple(items) if tag == "t" else set(items) if tag == "s" else frozenset(items)
    if tag == "d" and isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v):
        return {_decode(k): _decode(x) for k, x in v}
    if tag == "o" and isinstance(v, str):
        return _Opaque(v)
    raise ValueError("not a value")


_UNSAFE_EXCEPTIONS = (StopIteration, StopAsyncIteration, GeneratorExit)


def _rebuild_exception(name, text):
    cls = getattr(builtins, name, None) if isinstance(name, str) else None
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, _UNSAFE_EXCEPTIONS):
        try:
            return cls(text) if text else cls()
        except BaseException:
            pass
    return _SolutionError((str(name) + ": " + str(text)) if name and text else str(name or text))


class _Solution:
    """The judge's side of the zygote socket: one worker at a time, started on the first call of a test."""

    def __init__(self, fd):
        self.fd = fd
        self.alive = False
        self.gone = None  # why no further worker can be asked, once the protocol broke

    def _message(self):
        try:
            frame = _recv(self.fd)
            message = json.loads(frame) if frame is not None else None
        except BaseException as error:
            message, frame = None, b"?"
            self.gone = "the solution broke the harness protocol: " + _describe(error)
        if not isinstance(message, dict):
            self.alive = False
            self.gone = self.gone or ("the solution's processes ended" if frame is None else "the solution broke the harness protocol")
            raise _SolutionError(self.gone)
        if "exited" in message:
            self.alive = False
        return message

    def _write(self, data):
        # The solution's processes can all be gone (a worker may kill the zygote and exit): writing to them then
        # fails, and that is the solution's doing, never the harness's (an escaped BrokenPipeError was a harness_error).
        try:
            _send(self.fd, data)
        except OSError as error:
            self.alive = False
            self.gone = self.gone or "the solution's processes ended (" + _describe(error) + ")"
            raise _SolutionError(self.gone) from None

    def start(self):
        if self.gone:
            raise _SolutionError(self.gone)
        self._write(b"spawn")
        self.alive = True
        message = self._message()
        if message.get("loaded") is True:
            return
        self.end()
        if "load_error" in message:
            raise _SolutionError("the solution did not load: " + str(message["load_error"])[:250])
        if "missing" in message:
            raise _SolutionError("the solution defines no function " + _entry)
        raise _SolutionError("the solution's process ended while loading (%s)" % _how(message.get("exited")))

    def call(self, args, kwargs):
        try:
            frame = pickle.dumps((args, kwargs))
        except BaseException as error:
            raise _SolutionError("the test's arguments cannot be sent to the solution: " + _describe(error))
        if not self.alive:
            self.start()
        self._write(frame)
        message = self._message()
        if "value" in message:
            try:
                return _decode(message["value"])
            except BaseException:
                raise _SolutionError("the solution returned something that is not a value") from None
        if "raised" in message and isinstance(message["raised"], list) and len(message["raised"]) == 2:
            raise _rebuild_exception(*message["raised"])
        raise _SolutionError("the solution's process ended during the call (%s)" % _how(message.get("exited")))

    def end(self):
        """Ends the current worker (a worker that will not end runs into the time limit)."""
        if not self.alive or self.gone:
            return
        try:
            self._write(b"end")
        except _SolutionError:
            return
        while self.alive:
            try:
                self._message()
            except _SolutionError:
                return


def _how(code):
    if not isinstance(code, int):
        return "unknown"
    return "exit code %d" % code if code >= 0 else "killed by signal %d" % -code


def _non_dumpable():
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except BaseException:
        pass


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


class _CalledAtLoad(BaseException):
    """The test code called the function under test while it loaded (`check(add)` or `test_check()` at its end)."""


def _load_test(test, scope):
    """Runs the test code's top-level statements in `scope`, one at a time, skipping each that calls the function under
    test (it raises _CalledAtLoad): many exports of HumanEval-format sets end with `check(add)`, and that call, run with
    the solution, turned every wrong answer (or a deliberate raise) into "the test code did not load", an evaluation
    failure instead of reward 0. The judge runs check itself; module-level asserts on the function are not run."""
    compile(test, "test.py", "exec")  # syntax errors as the whole file gives them
    flags = 0
    for statement in ast.parse(test).body:
        if isinstance(statement, ast.ImportFrom) and statement.module == "__future__":
            for alias in statement.names:
                flags |= getattr(getattr(__future__, alias.name, None), "compiler_flag", 0)
        code = compile(ast.Module(body=[statement], type_ignores=[]), "test.py", "exec", flags=flags, dont_inherit=True)
        try:
            exec(code, scope)
        except _CalledAtLoad:
            pass


def _run_whole(check, candidate):
    """Calls check(candidate) and runs what it returns when that is its body still to run: an `async def check` or a
    check that yields returns a coroutine or a generator without running a line, and passed every solution."""
    import inspect
    result = check(candidate)
    if inspect.iscoroutine(result):
        import asyncio
        asyncio.run(result)
    elif inspect.isgenerator(result):
        for _ in result:
            pass


def _uncallable_check(check, candidate):
    """Whether `check` cannot be called as check(candidate)."""
    if not callable(check):
        return True
    import inspect
    try:
        inspect.signature(check).bind(candidate)
    except TypeError:
        return True
    except ValueError:  # no signature to read (a builtin): let the call decide
        pass
    return False


def _start_zygote(solution):
    _non_dumpable()
    ours, theirs = (s.detach() for s in socket.socketpair())
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.dup2(theirs, 3)
        os.closerange(4, 1 << 16)
        try:
            _zygote(3, solution)
        finally:
            os._exit(0)
    os.close(theirs)
    return ours


def _quiet():
    """What the prompt's and the test's code print (a test may print the solution's values) goes to /dev/null: the
    judge's stdout carries only its events (written to descriptor 1 by _emit), within the size the runner allows."""
    sink = open(os.devnull, "w")
    sys.stdout = sys.stderr = sink


_entry = ""
_nonce = []  # set after the zygote is forked


# The runner sizes the sandbox's output cap from the number of tests (humaneval-runner.ts harnessOutputBytes) and
# fails the evaluation when this output is cut, so its size must not be the solution's to choose: an error text (the
# solution's exception or values) is kept for the first _DETAILED_TESTS tests only (the report shows no more), at most
# _MAX_ERROR_JSON bytes of JSON; the task's own code writes to /dev/null (see _quiet), never to the result channel.
_DETAILED_TESTS = 20
_MAX_ERROR_JSON = 1024


def _emit(**event):
    if "error" in event and event.get("kind") == "result" and event.get("index", 0) >= _DETAILED_TESTS:
        del event["error"]
    if "error" in event:
        error = str(event["error"])
        while len(json.dumps(error)) > _MAX_ERROR_JSON:
            error = error[: len(error) * 3 // 4]
        event["error"] = error
    data = (_nonce[0] + " " + json.dumps(event) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def _main():
    global _entry
    lengths = [int(n) for n in _read_line(0).split()]
    solution = json.loads(_read_exact(0, lengths[0]))
    _entry = solution["entry_point"]
    fd = _start_zygote(solution)
    # The solution's processes run as the judge's uid and can signal it. SIGINT is the one signal Python turns into an
    # exception (KeyboardInterrupt): raised between tests it escaped as a harness_error, an evaluation failure the
    # solution chose instead of its reward. Ignored here (after the fork: the solution's processes keep the default).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    test = json.loads(_read_exact(0, lengths[1]))["test"]
    _nonce.append(_read_line(0))
    os.dup2(os.open(os.devnull, os.O_RDWR), 0)
    plan = _plan(test)
    total = len(plan[2]) if plan else 1
    _emit(kind="ready", total=total)
    stub = _Solution(fd)

    def finish():
        _emit(kind="done")
        try:
            _send(fd, b"quit")
        except OSError:
            pass
        os._exit(0)

    def candidate(*args, **kwargs):
        return stub.call(args, kwargs)

    # Everything that may fail on the task's side (its prompt, its test code, its check) and everything the judge opens
    # or imports happens before the solution runs: a broken task is an evaluation failure whatever the solution is (a
    # solution that did not load made it reward 0), and a judge whose descriptors the solution took away (prlimit)
    # needs none after it starts.
    _quiet()
    # The test code sees the prompt's names (imports, helpers), never the solution's.
    scope = {"__name__": "task", "__builtins__": builtins}
    try:
        exec(compile(solution["prompt"], "prompt.py", "exec"), scope)
    except BaseException:
        imports = [line for line in solution["prompt"].splitlines() if line.startswith(("import ", "from "))]
        try:
            exec(compile("\n".join(imports), "prompt.py", "exec"), scope)
        except BaseException:
            pass
    loading = [True]

    def entry(*args, **kwargs):
        if loading[0]:
            raise _CalledAtLoad()
        return candidate(*args, **kwargs)

    scope[_entry] = entry
    try:
        _load_test(test, scope)
        loading[0] = False
    except BaseException as error:
        _emit(kind="test_error", error=_describe(error))
        os._exit(0)
    # A test with nothing to call would fail every solution: the task's fault, not a reward of 0.
    if _uncallable_check(scope.get("check"), candidate):
        _emit(kind="test_error", error="the test code defines no check(candidate) taking the function under test")
        os._exit(0)

    try:
        stub.start()
    except _SolutionError as error:
        for i in range(total):
            _emit(kind="result", index=i, passed=False, error=_describe(error))
        finish()

    if plan is None:
        try:
            _run_whole(scope["check"], candidate)
            _emit(kind="result", index=0, passed=True)
        except BaseException as error:
            _emit(kind="result", index=0, passed=False, error=_describe(error))
        stub.end()
        finish()

    body, parameter, tests = plan
    names = scope
    names[parameter] = candidate
    setup_error = None
    index = 0
    # The statements after the last test belong to it: check(candidate) fails when one of them raises (asserts in a
    # helper it calls), so the last test's verdict waits for them. Emitted at once, it let `assert f(x) == y` then
    # `_more_checks(f)` pass a solution that only got the first right.
    last = max(tests)
    held = None
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
        if i == last:
            held = error
        elif i in tests:
            stub.end()
            _emit(kind="result", index=index, passed=error is None, **({"error": error} if error else {}))
            index += 1
    if held is None and setup_error is not None:
        held = "a statement after the last assert failed: " + setup_error
    stub.end()
    _emit(kind="result", index=index, passed=held is None, **({"error": held} if held else {}))
    finish()


if __name__ == "__main__":
    try:
        _main()
    except BaseException as _error:
        if _nonce:
            _emit(kind="harness_error", error=_describe(_error))
        sys.__stderr__.write("harness failed: " + _describe(_error) + "\n")
        os._exit(3)
