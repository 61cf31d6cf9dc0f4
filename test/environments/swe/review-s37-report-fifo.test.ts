import { afterAll, describe, expect, it } from 'vitest';
import { PYTEST_PLUGIN_MODULE, pytestPluginSource } from '../../../src/environments/swe/grading.js';
import { runTests } from '../../../src/environments/swe/test-run.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';

/** A test module whose process, at exit (after the plugin wrote and announced the report), replaces the report. */
const replacingTest = (replace: string): string => `
import atexit, os

@atexit.register
def _replace():
    p = os.environ["ROLLOUT_SWE_REPORT"]
    os.remove(p)
    ${replace}

def test_ok():
    pass
`;

// Review s37: the SWE eval reads back the pytest report, which the code under test can replace (it runs as the same
// user). The read goes through readFile (size bound, FIFO-safe open); a FIFO or a symlink to /dev/zero put there gave
// reward 0 — right — but with the reason "the report file is over 64 MiB", which it was not.
describe('the SWE eval against a report replaced by the code under test', () => {
  const driver = closeAfterAll(new BubblewrapDriver());
  let sandbox: Sandbox | undefined;
  afterAll(() => sandbox?.stop());

  it.each([
    ['a FIFO', 'os.mkfifo(p)'],
    ['a symlink to /dev/zero', 'os.symlink("/dev/zero", p)'],
  ])('%s: no report, said as not a regular file, at once', async (_name, replace) => {
    sandbox ??= await driver.start(testSpec({ wallClockMs: 120_000, memoryMb: 1024 }));
    await sandbox.writeFile('t/test_a.py', replacingTest(replace));
    const run = await runTests(sandbox, `${sandbox.workdir}/t`, 'python3 -m pytest -q -p no:cacheprovider test_a.py', { module: PYTEST_PLUGIN_MODULE, source: pytestPluginSource() }, { timeoutMs: 60_000 });
    expect(run.started).toBe(true);
    expect(run.report).toBeUndefined();
    expect(run.reportProblem).toMatch(/not a regular file/);
  }, 120_000);

  // The tail of the test output is read back the same way: `tail` opened a FIFO put in its place and waited for a writer
  // until the sandbox's command timeout (minutes), which could use up the task's wall clock.
  it('a FIFO in place of the test output: the output tail is empty, at once', async () => {
    const patient = await driver.start(testSpec({ wallClockMs: 900_000, commandTimeoutMs: 600_000, memoryMb: 1024 }));
    try {
      await patient.writeFile('t/test_a.py', replacingTest('out = os.path.join(os.path.dirname(p), "test-output.txt")\n    os.remove(out)\n    os.mkfifo(out)'));
      const run = await runTests(patient, `${patient.workdir}/t`, 'python3 -m pytest -q -p no:cacheprovider test_a.py', { module: PYTEST_PLUGIN_MODULE, source: pytestPluginSource() }, { timeoutMs: 60_000 });
      expect(run.started).toBe(true);
      expect(run.outputTail).toBe('');
    } finally {
      await patient.stop();
    }
  }, 60_000);

  it('a sparse file past the bound: still said as over it', async () => {
    sandbox ??= await driver.start(testSpec({ wallClockMs: 120_000, memoryMb: 1024 }));
    await sandbox.writeFile('t/test_a.py', replacingTest('open(p, "w").truncate(65 << 20)'));
    const run = await runTests(sandbox, `${sandbox.workdir}/t`, 'python3 -m pytest -q -p no:cacheprovider test_a.py', { module: PYTEST_PLUGIN_MODULE, source: pytestPluginSource() }, { timeoutMs: 60_000 });
    expect(run.reportProblem).toBe('the report file is over 64 MiB');
  }, 120_000);
});
