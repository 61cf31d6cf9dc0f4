import { describe, expect, it } from 'vitest';
import { evaluatePatch } from '../../../src/environments/swe/evaluate-patch.js';
import { diffWorkingCopy, prepareWorkingCopy, UnreadableWorkingCopy } from '../../../src/environments/swe/repo-ops.js';
import { validateSweInstance, type SweInstance } from '../../../src/environments/swe/instance.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { sweRepo } from '../../support/swe-repo.js';

/**
 * Test ids pytest makes from the parametrization below: spaces, brackets, "::", quotes included, and non-ASCII as
 * pytest escapes it in ids (é → \xe9), which is how SWE-bench's lists spell them too.
 */
const ODD_IDS = ['tests/test_calc.py::test_add[1 + 1-2]', 'tests/test_calc.py::test_add[a::b-[x]]', "tests/test_calc.py::TestCalc::test_mul[it's-\\xe9]"];

const REPO = {
  'calc.py': 'def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n',
  'tests/__init__.py': '',
  'tests/test_calc.py': [
    'import pytest',
    'from calc import add, mul',
    '',
    '@pytest.mark.parametrize("expr,expected", [("1 + 1", "2"), ("a::b", "[x]")])',
    'def test_add(expr, expected):',
    '    assert add(2, 2) == 4',
    '',
    'class TestCalc:',
    '    @pytest.mark.parametrize("word,accent", [("it\'s", "\u00e9")])',
    '    def test_mul(self, word, accent):',
    '        assert mul(2, 3) == 6',
    '',
    '    def test_skipped(self):',
    '        pytest.skip("not here")',
    '',
    '@pytest.mark.xfail(reason="known")',
    'def test_known_bug():',
    '    assert False',
    '',
  ].join('\n'),
};

/** The fix of calc.add as the agent's `git diff` would give it. */
const FIX = ['diff --git a/calc.py b/calc.py', '--- a/calc.py', '+++ b/calc.py', '@@ -1,2 +1,2 @@', ' def add(a, b):', '-    return a - b', '+    return a + b', ''].join('\n');

/**
 * evaluatePatch on real bubblewrap sandboxes of the SWE base image (Debian python3, pytest, git), with a small
 * repository bound read-only at /testbed: pytest results by exact node id, the SWE-bench rule, and every way an
 * eval ends (patch not applying or tests past their budget → reward 0 with the reason; no pytest, a broken test
 * patch → environment_error; the task's time running out → deadline_exceeded).
 */
describe.runIf(process.getuid?.() === 0 || process.env.CI)('evaluatePatch in a real sandbox', () => {
  const fx = sweRepo('rollout-swe-eval-', REPO);

  async function sandbox(): Promise<Sandbox> {
    return fx.start();
  }

  function instance(fields: Record<string, unknown> = {}): SweInstance {
    return validateSweInstance({
      image: fx.image,
      problem_statement: 'add subtracts',
      test_command: 'python3 -m pytest -p no:cacheprovider tests',
      FAIL_TO_PASS: ODD_IDS.slice(0, 2),
      PASS_TO_PASS: [ODD_IDS[2], 'tests/test_calc.py::test_known_bug'],
      ...fields,
    });
  }

  it('reads every test by its exact node id and rewards a patch that resolves the instance', async () => {
    const result = await evaluatePatch(await sandbox(), instance(), FIX, { testTimeoutMs: 60_000 });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ODD_IDS[0]!]: 'passed', [ODD_IDS[1]!]: 'passed' }, fraction: 1 });
    // An xfail counts as passing (SWE-bench's rule).
    expect(result.report.PASS_TO_PASS).toMatchObject({ statuses: { [ODD_IDS[2]!]: 'passed', 'tests/test_calc.py::test_known_bug': 'xfail' }, passed: 2, skipped: 0 });
    expect(result).toMatchObject({ reward: 1, details: { fail_to_pass: 1, pass_to_pass: 1, applied: 1, tests_timed_out: 0 } });
    expect(result.report).toMatchObject({ applied: true, resolved: true, patch: FIX, patch_truncated: false, test_exit_code: 0, tests_timed_out: false });
  }, 120_000);

  it('gives 0 without the fix, and counts a test the run never reported as failed', async () => {
    const ghost = 'tests/test_calc.py::test_that_does_not_exist';
    const result = await evaluatePatch(await sandbox(), instance({ PASS_TO_PASS: [ODD_IDS[2], ghost] }), '', { testTimeoutMs: 60_000 });
    expect(result.reward).toBe(0);
    expect(result.details).toEqual({ fail_to_pass: 0, pass_to_pass: 0.5, applied: 1, tests_timed_out: 0 });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ODD_IDS[0]!]: 'failed', [ODD_IDS[1]!]: 'failed' } });
    expect(result.report.PASS_TO_PASS).toMatchObject({ statuses: { [ghost]: 'missing' }, failed: 1 });
    expect(result.report.test_output_tail).toContain('failed');
  }, 120_000);

  it('gives 0 with the reason when the patch does not apply, without running the tests', async () => {
    const stale = FIX.replace('-    return a - b', '-    return a - b  # not what the file says');
    const result = await evaluatePatch(await sandbox(), instance(), stale, { testTimeoutMs: 60_000 });
    expect(result).toMatchObject({ reward: 0, details: { applied: 0, fail_to_pass: 0, pass_to_pass: 0 }, report: { applied: false, resolved: false, patch: stale } });
    expect(String(result.report.apply_error)).toMatch(/calc\.py/);
    expect(result.report.test_exit_code).toBeUndefined();
  }, 120_000);

  it('applies the test patch after resetting the files it touches, so the agent cannot keep its own version of the tests', async () => {
    const testPatch = [
      '--- a/tests/test_calc.py',
      '+++ b/tests/test_calc.py',
      '@@ -16,3 +16,7 @@',
      ' @pytest.mark.xfail(reason="known")',
      ' def test_known_bug():',
      '     assert False',
      '+',
      '+',
      '+def test_new():',
      '+    assert add(1, 2) == 3',
      '',
    ].join('\n');
    // The agent "fixed" the test file instead of the code: reset before the test patch applies.
    const cheat = ['--- a/tests/test_calc.py', '+++ b/tests/test_calc.py', '@@ -1,2 +1,2 @@', '-import pytest', '+import pytest  # cheat', ' from calc import add, mul', ''].join('\n');
    const inst = instance({ test_patch: testPatch, FAIL_TO_PASS: ['tests/test_calc.py::test_new'], PASS_TO_PASS: [] });
    const unfixed = await evaluatePatch(await sandbox(), inst, cheat, { testTimeoutMs: 60_000 });
    expect(unfixed.report.FAIL_TO_PASS).toMatchObject({ statuses: { 'tests/test_calc.py::test_new': 'failed' } });
    const fixed = await evaluatePatch(await sandbox(), inst, FIX, { testTimeoutMs: 60_000 });
    expect(fixed.reward).toBe(1);
  }, 120_000);

  it("gives 0 with tests_timed_out when the tests run past their budget with the patch applied (SWE-bench: unresolved)", async () => {
    // The agent's "fix" makes add() loop forever: pytest starts, then hangs in the first test until the budget ends.
    const hang = FIX.replace('+    return a + b', '+    while True:\n+        pass');
    const hangPatch = hang.replace('@@ -1,2 +1,2 @@', '@@ -1,2 +1,3 @@');
    const result = await evaluatePatch(await sandbox(), instance(), hangPatch, { testTimeoutMs: 10_000 });
    expect(result).toMatchObject({
      reward: 0,
      details: { fail_to_pass: 0, pass_to_pass: 0, applied: 1, tests_timed_out: 1 },
      report: { applied: true, resolved: false, tests_timed_out: true, test_error: expect.stringContaining('did not finish within 10000 ms with the patch applied') },
    });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ODD_IDS[0]!]: 'missing' } });
  }, 120_000);

  it("is TIMEOUT's deadline_exceeded, not reward 0, when the task's own time runs out during the tests", async () => {
    const hangPatch = FIX.replace('+    return a + b', '+    while True:\n+        pass').replace('@@ -1,2 +1,2 @@', '@@ -1,2 +1,3 @@');
    const short = await fx.start({ wallClockMs: 6_000 });
    await expect(evaluatePatch(short, instance(), hangPatch, { testTimeoutMs: 60_000 })).rejects.toMatchObject({ code: 'deadline_exceeded' });
  }, 120_000);

  it('is an environment_error, not reward 0, when the eval cannot run', async () => {
    const noPytest = evaluatePatch(await sandbox(), instance({ test_command: 'no-such-test-runner tests' }), FIX, { testTimeoutMs: 60_000 });
    await expect(noPytest).rejects.toMatchObject({ code: 'environment_error', message: expect.stringContaining('did not start pytest') });
    // A command that never gets to pytest within the budget: nothing the patch did ran yet, so the eval could not run.
    const slow = evaluatePatch(await sandbox(), instance({ test_command: 'sleep 30' }), FIX, { testTimeoutMs: 500 });
    await expect(slow).rejects.toMatchObject({ code: 'environment_error', message: expect.stringContaining('did not start pytest within 500 ms') });
    const badTestPatch = evaluatePatch(await sandbox(), instance({ test_patch: '--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n' }), FIX, { testTimeoutMs: 60_000 });
    await expect(badTestPatch).rejects.toMatchObject({ code: 'environment_error', message: expect.stringContaining('test_patch') });
    const noRepo = evaluatePatch(await sandbox(), instance({ repo_path: '/nowhere' }), FIX, { testTimeoutMs: 60_000 });
    await expect(noRepo).rejects.toMatchObject({ code: 'environment_error', message: expect.stringContaining('/nowhere') });
  }, 180_000);

  // Found by review: the patch's code runs inside pytest as the same user as the report plugin, so it can overwrite the
  // report. Breaking it must grade the attempt 0, not make it an infrastructure failure the trainer filters out (the
  // policy could opt out of a 0). Package code, since a conftest.py of the patch no longer runs (reward-forgery.test.ts).
  function atExit(body: string): string {
    const lines = ['', '', 'import atexit, os', '', '', '@atexit.register', 'def _at_exit():', ...body.split('\n').map((l) => `    ${l}`)];
    const tail = ['', '', 'def mul(a, b):', '    return a * b'];
    return ['diff --git a/calc.py b/calc.py', '--- a/calc.py', '+++ b/calc.py', `@@ -3,4 +3,${4 + lines.length} @@`, ...tail.map((l) => ` ${l}`), ...lines.map((l) => `+${l}`), ''].join('\n');
  }

  it('gives 0 with the reason when the patch overwrites the pytest report with garbage or past its read bound', async () => {
    const garbage = await evaluatePatch(await sandbox(), instance(), atExit('open(os.environ["ROLLOUT_SWE_REPORT"], "w").write("garbage")'), { testTimeoutMs: 60_000 });
    expect(garbage).toMatchObject({ reward: 0, report: { applied: true, resolved: false, test_error: expect.stringContaining('the pytest report could not be used (the report file was changed after pytest wrote it') } });
    const huge = await evaluatePatch(
      await sandbox(),
      instance(),
      atExit('with open(os.environ["ROLLOUT_SWE_REPORT"], "w") as f:\n    f.write(" " * (65 << 20))'),
      { testTimeoutMs: 60_000 },
    );
    expect(huge).toMatchObject({ reward: 0, report: { resolved: false, test_error: expect.stringContaining('the report file is over 64 MiB') } });
    const gone = await evaluatePatch(await sandbox(), instance(), atExit('os.remove(os.environ["ROLLOUT_SWE_REPORT"])'), { testTimeoutMs: 60_000 });
    expect(gone).toMatchObject({ reward: 0, report: { resolved: false, test_error: expect.stringContaining('the report file was deleted after pytest wrote it') } });
  }, 180_000);

  // Found by review (helper-37): the agent's diff was taken with the working copy's own git, which the agent controls:
  // `rm -rf .git` (or a broken index) made the eval an environment_error, which trainers drop, instead of grading
  // what the agent changed. Then the diff is now taken against the image's repository with a git directory of its own.
  it("takes the agent's diff whatever the agent did to the working copy's git", async () => {
    const agent = await sandbox();
    const dir = await prepareWorkingCopy(agent, '/testbed');
    const fix = await agent.exec(['bash', '-c', 'sed -i "s/return a - b/return a + b/" calc.py && git -c user.name=a -c user.email=a@b commit -qam wip && rm -rf .git && echo x > new.txt && chmod +x tests/__init__.py'], { cwd: dir });
    expect(fix.exitCode).toBe(0);
    const diff = await diffWorkingCopy(agent, '/testbed', dir, 1 << 20);
    expect(diff.patch).toContain('-    return a - b\n+    return a + b');
    expect(diff.patch).toContain('+++ b/new.txt');
    expect(diff.patch).toMatch(/diff --git a\/tests\/__init__.py b\/tests\/__init__.py\nold mode 100644\nnew mode 100755/);
    expect(diff.patch).not.toContain('.git/');
    expect((await evaluatePatch(await sandbox(), instance(), diff.patch, { testTimeoutMs: 60_000 })).reward).toBe(1);
    // An untouched working copy gives an empty diff; one the agent deleted is its doing (reward 0), not the eval's.
    const clean = await sandbox();
    const cleanDir = await prepareWorkingCopy(clean, '/testbed');
    expect(await diffWorkingCopy(clean, '/testbed', cleanDir, 1 << 20)).toEqual({ patch: '', bytes: 0 });
    // With its git intact, the working copy's own base ref is what the diff is taken against.
    expect((await clean.exec(['sed', '-i', 's/return a - b/return a + b/', 'calc.py'], { cwd: cleanDir })).exitCode).toBe(0);
    expect((await diffWorkingCopy(clean, '/testbed', cleanDir, 1 << 20)).patch).toContain('-    return a - b\n+    return a + b');
    expect((await clean.exec(['rm', '-rf', cleanDir])).exitCode).toBe(0);
    await expect(diffWorkingCopy(clean, '/testbed', cleanDir, 1 << 20)).rejects.toBeInstanceOf(UnreadableWorkingCopy);
  }, 120_000);

  // Review s37 (found by helper-65): the diff was written to a fixed path of the agent's own sandbox,
  // /tmp/rollout-swe/agent.patch. An agent that put a FIFO there made the eval wait for the command timeout, and one
  // that put a file at /tmp/rollout-swe (or a symlink to /dev/full at the patch) failed it: environment_error both,
  // which trainers drop — a way out of a 0. The diff now goes to a directory of its own (mktemp) each time.
  it('takes the diff whatever the agent planted at the scratch paths of its sandbox', async () => {
    const plants = [
      'mkdir -p /tmp/rollout-swe && mkfifo /tmp/rollout-swe/agent.patch',
      'printf x > /tmp/rollout-swe',
      'mkdir -p /tmp/rollout-swe && ln -s /dev/full /tmp/rollout-swe/agent.patch',
      'mkdir -p /tmp/rollout-swe && chmod 500 /tmp/rollout-swe',
    ];
    for (const plant of plants) {
      const agent = await sandbox();
      const dir = await prepareWorkingCopy(agent, '/testbed');
      expect((await agent.exec(['bash', '-c', `sed -i "s/return a - b/return a + b/" calc.py && ${plant}`], { cwd: dir })).exitCode).toBe(0);
      const diff = await diffWorkingCopy(agent, '/testbed', dir, 1 << 20, { timeoutMs: 20_000 });
      expect(diff.patch, plant).toContain('-    return a - b\n+    return a + b');
    }
  }, 180_000);

  // Found by review (helper-37): a test patch that applies to the base but not on top of the agent's patch (a file the
  // agent put where the test patch makes a directory) was an environment_error, which trainers drop: the agent could
  // opt out of a 0. Only a test patch that does not apply to the base is the instance's fault.
  it("gives 0 with the reason when the agent's patch keeps the test patch from applying", async () => {
    // Outside a test tree (a directory named test or tests: everything the patch changed there is put back first).
    const blocker = ['diff --git a/checks/unit b/checks/unit', 'new file mode 100644', '--- /dev/null', '+++ b/checks/unit', '@@ -0,0 +1 @@', '+in the way', ''].join('\n');
    const testPatch = [
      'diff --git a/checks/unit/test_new.py b/checks/unit/test_new.py',
      'new file mode 100644',
      '--- /dev/null',
      '+++ b/checks/unit/test_new.py',
      '@@ -0,0 +1,4 @@',
      '+from calc import add',
      '+',
      '+def test_new():',
      '+    assert add(1, 2) == 3',
      '',
    ].join('\n');
    const inst = instance({ test_patch: testPatch, test_command: 'python3 -m pytest -p no:cacheprovider checks', FAIL_TO_PASS: ['checks/unit/test_new.py::test_new'], PASS_TO_PASS: [] });
    const blocked = await evaluatePatch(await sandbox(), inst, `${FIX}${blocker}`, { testTimeoutMs: 60_000 });
    expect(blocked).toMatchObject({
      reward: 0,
      details: { fail_to_pass: 0, pass_to_pass: 0, applied: 1, tests_timed_out: 0 },
      report: { applied: true, resolved: false, test_error: expect.stringContaining("the instance's test_patch does not apply on top of the patch") },
    });
    // The same test patch with an honest fix: it applies and the test passes.
    expect((await evaluatePatch(await sandbox(), inst, FIX, { testTimeoutMs: 60_000 })).reward).toBe(1);
  }, 120_000);

  it('a blocker the patch put in a test tree (a file where the test patch makes a directory) is removed with the tree: the test patch applies, the fix is graded', async () => {
    const blocker = ['diff --git a/tests/unit b/tests/unit', 'new file mode 100644', '--- /dev/null', '+++ b/tests/unit', '@@ -0,0 +1 @@', '+in the way', ''].join('\n');
    const testPatch = ['diff --git a/tests/unit/test_new.py b/tests/unit/test_new.py', 'new file mode 100644', '--- /dev/null', '+++ b/tests/unit/test_new.py', '@@ -0,0 +1,4 @@', '+from calc import add', '+', '+def test_new():', '+    assert add(1, 2) == 3', ''].join('\n');
    const inst = instance({ test_patch: testPatch, FAIL_TO_PASS: ['tests/unit/test_new.py::test_new'], PASS_TO_PASS: [] });
    const result = await evaluatePatch(await sandbox(), inst, `${FIX}${blocker}`, { testTimeoutMs: 60_000 });
    expect(result).toMatchObject({ reward: 1, report: { resolved: true, test_infrastructure_reset: ['tests/unit'] } });
  }, 120_000);

  // Found by review (helper-37): a patch that broke pytest's configuration kept pytest from starting (before any plugin
  // loads), read as "the eval cannot run": an environment_error, which trainers drop, for what the patch did. Since
  // helper-44 the configuration files are test infrastructure, put back before the tests run: the fix is graded alone.
  it("grades the fix alone when the patch also breaks pytest's configuration, which is put back before the tests run", async () => {
    const ini = ['diff --git a/pytest.ini b/pytest.ini', 'new file mode 100644', '--- /dev/null', '+++ b/pytest.ini', '@@ -0,0 +1,2 @@', '+[pytest', '+addopts = = =', ''].join('\n');
    const result = await evaluatePatch(await sandbox(), instance(), `${FIX}${ini}`, { testTimeoutMs: 60_000 });
    expect(result).toMatchObject({ reward: 1, details: { fail_to_pass: 1, pass_to_pass: 1, applied: 1 }, report: { applied: true, resolved: true, test_infrastructure_reset: ['pytest.ini'] } });
  }, 120_000);

  // Found by review (helper-37): a skip counted neither way and an all-skipped list as passing, so a patch that made
  // the tests it should fix skip was resolved.
  it('gives 0 to a patch that makes the FAIL_TO_PASS tests skip instead of fixing them', async () => {
    const skip = ['diff --git a/calc.py b/calc.py', '--- a/calc.py', '+++ b/calc.py', '@@ -1,2 +1,3 @@', ' def add(a, b):', '+    import unittest; raise unittest.SkipTest("later")', '     return a - b', ''].join('\n');
    const result = await evaluatePatch(await sandbox(), instance(), skip, { testTimeoutMs: 60_000 });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ODD_IDS[0]!]: 'skipped', [ODD_IDS[1]!]: 'skipped' }, passed: 0, failed: 2, skipped: 2, fraction: 0 });
    expect(result).toMatchObject({ reward: 0, details: { fail_to_pass: 0, applied: 1 }, report: { resolved: false } });
  }, 120_000);
});
