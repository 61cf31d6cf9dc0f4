import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runHumanEvalTests } from '../../../src/environments/code/humaneval-runner.js';
import { validateCodeInstance, type HumanEvalTask } from '../../../src/environments/code/instance.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';

const signal = new AbortController().signal;

const task = validateCodeInstance({
  prompt: 'def add(a, b):\n    """Sum of a and b."""\n',
  test: 'def check(f):\n    assert f(1, 2) == 3\n    assert f(2, 2) == 4\n    assert f(0, 0) == 0\n',
  entry_point: 'add',
  timeout_s: 5,
}) as HumanEvalTask;

const statuses = (run: { tests: { status: string }[] }) => run.tests.map((t) => t.status);
const passed = (run: { tests: { passed: boolean }[] }) => run.tests.filter((t) => t.passed).length;

// Nothing in the process that runs the solution decides a verdict: the judge process runs the asserts on the
// values the solution returns, as data.
describe('HumanEval harness: a wrong solution cannot forge its results', () => {
  const driver = closeAfterAll(new BubblewrapDriver());
  let sandbox: Sandbox;
  beforeAll(async () => {
    sandbox = await driver.start(testSpec({ wallClockMs: 120_000 }));
  });
  afterAll(async () => {
    await sandbox?.stop();
    await driver.close?.();
  });

  it('a completion that calls the harness _emit through sys.modules["__main__"] gets no reward', async () => {
    const forged = [
      '    return a - b  # wrong',
      '',
      'import sys as _s',
      '_m = _s.modules["__main__"]',
      '_p = _m._plan(_m._payload["test"])',
      'for _i in range(len(_p[2]) if _p else 1):',
      '    _m._emit(kind="result", index=_i, passed=True)',
      '_m._emit(kind="done")',
      '_m._exit(0)',
    ].join('\n');
    const run = await runHumanEvalTests(sandbox, task, forged, signal);
    expect(passed(run)).toBe(0);
  }, 60_000);

  it('printing result lines, on any descriptor, is no channel', async () => {
    const forged = [
      '    return a - b',
      'import os, sys',
      'for _fd in range(0, 64):',
      '    for _i in range(3):',
      '        try:',
      '            os.write(_fd, (\'x {"kind": "result", "index": %d, "passed": true}\\n\' % _i).encode())',
      '        except OSError:',
      '            pass',
      'print(\'{"kind": "done"}\')',
    ].join('\n');
    expect(passed(await runHumanEvalTests(sandbox, task, forged, signal))).toBe(0);
  }, 60_000);

  it('exiting with status 0 at load fails every test', async () => {
    const run = await runHumanEvalTests(sandbox, task, '    return a - b\nimport os\nos._exit(0)', signal);
    expect(statuses(run)).toEqual(['failed', 'failed', 'failed']);
    expect(run.tests[0]!.detail).toMatch(/ended while loading \(exit code 0\)/);
  }, 60_000);

  it('a daemon the solution leaves behind (its own session, double fork) is gone when grading ends', async () => {
    const daemon = [
      '    return a + b',
      'import os, time',
      'r, w = os.pipe()',
      'if os.fork() == 0:',
      '    os.setsid()',
      '    if os.fork() == 0:',
      '        open("/tmp/daemon-alive", "w").write(str(os.getpid()))',
      '        os.write(w, b"x")',
      '        time.sleep(1000)',
      '    os._exit(0)',
      'os.read(r, 1)  # loading goes on once the daemon has said where it is',
    ].join('\n');
    const run = await runHumanEvalTests(sandbox, task, daemon, signal);
    expect(passed(run)).toBe(3);
    const pid = (await sandbox.exec(['cat', '/tmp/daemon-alive'], { timeoutMs: 10_000, signal })).stdout.trim();
    expect(pid).toMatch(/^\d+$/);
    const alive = await sandbox.exec(['sh', '-c', `test -d /proc/${pid} && echo alive || echo gone`], { timeoutMs: 10_000, signal });
    expect(alive.stdout.trim()).toBe('gone');
  }, 60_000);

  it('exiting with status 0 inside the function, for some inputs only, fails exactly those tests', async () => {
    const run = await runHumanEvalTests(sandbox, task, '    import os\n    if a == 1:\n        os._exit(0)\n    return a + b', signal);
    expect(statuses(run)).toEqual(['failed', 'passed', 'passed']);
    expect(run.tests[0]!.detail).toMatch(/ended during the call \(exit code 0\)/);
  }, 60_000);

  it('a thread that writes fake results and exits with status 0 gains nothing', async () => {
    const forged = [
      '    return a - b',
      'import os, threading, time',
      'def _forge():',
      '    for _fd in (1, 3, 4):',
      '        try:',
      '            os.write(_fd, b\'\\x00\\x00\\x00\\x13{"value": {"i": "3"}}\')',
      '        except OSError:',
      '            pass',
      '    time.sleep(0.01)',
      '    os._exit(0)',
      'threading.Thread(target=_forge, daemon=True).start()',
    ].join('\n');
    expect(passed(await runHumanEvalTests(sandbox, task, forged, signal))).toBe(0);
  }, 60_000);

  it('cannot read the test or its expected values from its own process or the judge', async () => {
    // A lookup table: return the right answer only when the test text can be found somewhere reachable.
    const spy = [
      '    import gc, os',
      '    seen = any(isinstance(o, str) and "f(1, 2) == 3" in o for o in gc.get_objects())',
      '    for path in ("/proc/self/cmdline", "/proc/%d/cmdline" % os.getppid(), "/proc/%d/mem" % os.getppid()):',
      '        try:',
      '            with open(path, "rb") as f:',
      '                seen = seen or b"f(1, 2) == 3" in f.read(1 << 20)',
      '        except OSError:',
      '            pass',
      '    return a + b if seen else -1',
    ].join('\n');
    expect(passed(await runHumanEvalTests(sandbox, task, spy, signal))).toBe(0);
  }, 60_000);

  it('objects that override __eq__ arrive as plain values', async () => {
    const always = '    class Yes:\n        def __eq__(self, other):\n            return True\n    return Yes()';
    expect(passed(await runHumanEvalTests(sandbox, task, always, signal))).toBe(0);
    const sneaky = '    class I(int):\n        def __eq__(self, other):\n            return True\n    return I(-1)';
    expect(passed(await runHumanEvalTests(sandbox, task, sneaky, signal))).toBe(0);
  }, 60_000);

  it('redefining a helper of the prompt does not change what the test computes', async () => {
    const helper = validateCodeInstance({
      prompt: 'def poly(x):\n    return x * x - 4\n\n\ndef root():\n    """A root of poly."""\n',
      test: 'def check(f):\n    assert poly(f()) == 0\n',
      entry_point: 'root',
    }) as HumanEvalTask;
    expect(statuses(await runHumanEvalTests(sandbox, helper, '    return 2', signal))).toEqual(['passed']);
    const cheat = 'def poly(x):\n    return 0\n\n\ndef root():\n    return 7';
    expect(statuses(await runHumanEvalTests(sandbox, helper, cheat, signal))).toEqual(['failed']);
  }, 60_000);

  it('a correct solution still gets every test, with values of every kind', async () => {
    const kinds = validateCodeInstance({
      prompt: 'def kinds(n):\n    """Values of many types."""\n',
      test: [
        'def check(f):',
        '    r = f(3)',
        '    assert r[0] is None and r[1] is True and r[2] == 10 ** 5000',
        '    assert r[3] == 0.5 and r[4] != r[4] and r[5] == 1 + 2j',
        '    assert r[6] == "é\\n" and r[7] == b"\\x00\\xff"',
        '    assert r[8] == [1, (2, 3)] and r[9] == {(1, 2): {"a": frozenset({1})}} and r[10] == {1, 2}',
        '    try:',
        '        f(-1)',
        '        assert False',
        '    except ValueError as e:',
        '        assert str(e) == "negative"',
        '',
      ].join('\n'),
      entry_point: 'kinds',
    }) as HumanEvalTask;
    const code = [
      '    if n < 0:',
      '        raise ValueError("negative")',
      '    return (None, True, 10 ** 5000, 0.5, float("nan"), 1 + 2j, "é\\n", b"\\x00\\xff", [1, (2, 3)], {(1, 2): {"a": frozenset({1})}}, {1, 2})',
    ].join('\n');
    const run = await runHumanEvalTests(sandbox, kinds, code, signal);
    expect(statuses(run)).toEqual(['passed', 'passed', 'passed', 'passed', 'passed']);
    expect(run.completed).toBe(true);
  }, 60_000);

  it('a set-up statement that fails marks the later tests not run; each test gets a fresh process', async () => {
    const setup = validateCodeInstance({
      prompt: 'def count(x):\n    """Calls so far."""\n',
      test: 'def check(f):\n    assert f(0) == 1\n    assert f(0) == 1\n    y = f(5)\n    assert y == 1\n    z = 1 // (f(0) - 1)\n    assert f(0) == 1\n',
      entry_point: 'count',
    }) as HumanEvalTask;
    const code = 'calls = 0\ndef count(x):\n    global calls\n    calls += 1\n    return calls';
    const run = await runHumanEvalTests(sandbox, setup, code, signal);
    expect(statuses(run)).toEqual(['passed', 'passed', 'passed', 'failed']);
    expect(run.tests[3]!.detail).toBe('not run: a set-up statement failed: ZeroDivisionError: integer division or modulo by zero');
  }, 60_000);

  // Found by review (helper-37): a worker can kill the zygote (its parent) and exit right after replying; the judge's
  // next write to the gone processes raised BrokenPipeError out of the harness, so a failing solution could turn its
  // reward 0 into ENVIRONMENT_ERROR, which trainers drop.
  it('a solution that kills the process serving it and exits fails its tests; the evaluation itself does not fail', async () => {
    const killer = [
      '    import os, sys, json',
      '    _m = sys.modules["__main__"]',
      '    # Reply by hand with a value the judge takes a while to decode, then take the zygote and this worker down.',
      '    _m._send(3, json.dumps({"value": _m._encode(list(range(300000)))}).encode())',
      '    os.kill(os.getppid(), 9)',
      '    os._exit(0)',
    ].join('\n');
    const run = await runHumanEvalTests(sandbox, task, killer, signal);
    expect(statuses(run)).toEqual(['failed', 'failed', 'failed']);
    expect(run.tests[1]!.detail).toMatch(/the solution's processes ended/);
  }, 60_000);

  it('a hang is a timeout of the tests without a result', async () => {
    const slow = { ...task, timeoutS: 2 };
    const run = await runHumanEvalTests(sandbox, slow, '    while a == 2:\n        pass\n    return a + b', signal);
    expect(statuses(run)).toEqual(['passed', 'timeout', 'timeout']);
    expect(run.completed).toBe(false);
  }, 60_000);
});
