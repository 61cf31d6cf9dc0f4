import { describe, expect, it } from 'vitest';
import { evaluatePatch } from '../../../src/environments/swe/evaluate-patch.js';
import { validateSweInstance, type SweInstance } from '../../../src/environments/swe/instance.js';
import type { Evaluation } from '../../../src/environments/types.js';
import { sweRepo } from '../../support/swe-repo.js';

/**
 * Review s42 (helper-103): SWE-bench counts an xfail as passing, so code under test that calls `pytest.xfail()` (public
 * API, one line, no pytest internals) turned every FAIL_TO_PASS test it touches into a pass: reward 1 with add() still
 * broken. The expected failures of the tests themselves (a marker, or an imperative xfail in the test file, its
 * conftest or its test tree) still count as passing, as SWE-bench's rule says. Run for real: bubblewrap sandbox of the
 * SWE base image, pytest with the report plugin.
 */
const ADD = 'tests/test_calc.py::test_add';
const MUL = 'tests/test_calc.py::test_mul';
const OLD = 'tests/test_calc.py::test_old_python';
const HELPED = 'tests/test_calc.py::test_helped';
const FIXTURE = 'tests/test_calc.py::test_fixture';

const REPO = {
  'calc.py': 'def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n',
  'tests/__init__.py': '',
  // Expected failures the tests declare themselves: in the test, through a helper of the test tree, through a fixture.
  'tests/helpers.py': 'import pytest\n\n\ndef not_here():\n    pytest.xfail("not on this platform")\n',
  'tests/conftest.py': 'import pytest\n\n\n@pytest.fixture\ndef unsupported():\n    pytest.xfail("unsupported here")\n',
  'tests/test_calc.py': [
    'import pytest',
    'from calc import add, mul',
    'from tests.helpers import not_here',
    '',
    '',
    'def test_add():',
    '    assert add(2, 2) == 4',
    '',
    '',
    'def test_mul():',
    '    assert mul(2, 3) == 6',
    '',
    '',
    'def test_old_python():',
    '    pytest.xfail("needs an old python")',
    '',
    '',
    'def test_helped():',
    '    not_here()',
    '',
    '',
    'def test_fixture(unsupported):',
    '    pass',
    '',
  ].join('\n'),
};

/** add() left broken, made to declare its own test an expected failure: `lines` replace its body. */
function xfailInAdd(lines: string[]): string {
  return ['diff --git a/calc.py b/calc.py', '--- a/calc.py', '+++ b/calc.py', '@@ -1,2 +1,' + String(2 + lines.length) + ' @@', ' def add(a, b):', ...lines.map((l) => `+${l}`), '     return a - b', ''].join('\n');
}

const FIX = ['diff --git a/calc.py b/calc.py', '--- a/calc.py', '+++ b/calc.py', '@@ -1,2 +1,2 @@', ' def add(a, b):', '-    return a - b', '+    return a + b', ''].join('\n');

describe.runIf(process.getuid?.() === 0 || process.env.CI)('an expected failure declared by the code under test', () => {
  const fx = sweRepo('rollout-swe-xfail-', REPO);

  async function evaluate(patch: string): Promise<Evaluation> {
    const sandbox = await fx.start();
    const instance: SweInstance = validateSweInstance({
      image: fx.image,
      problem_statement: 'add subtracts',
      test_command: 'python3 -m pytest -p no:cacheprovider tests',
      FAIL_TO_PASS: [ADD],
      PASS_TO_PASS: [MUL, OLD, HELPED, FIXTURE],
    });
    return evaluatePatch(sandbox, instance, patch, { testTimeoutMs: 60_000 });
  }

  it("rewards the fix, the tests' own expected failures (in the test, a helper of its tree, a fixture of its conftest) counted as passing", async () => {
    const result = await evaluate(FIX);
    expect(result.report.PASS_TO_PASS).toMatchObject({ statuses: { [MUL]: 'passed', [OLD]: 'xfail', [HELPED]: 'xfail', [FIXTURE]: 'xfail' }, fraction: 1 });
    expect(result).toMatchObject({ reward: 1, report: { resolved: true } });
  }, 120_000);

  it('gives 0 to code under test that calls pytest.xfail() (or raises its exception, or execs it) instead of being fixed', async () => {
    for (const body of [
      ['    import pytest; pytest.xfail("known bug")'],
      ['    import pytest', '    raise pytest.xfail.Exception("known bug")'],
      ['    exec("import pytest; pytest.xfail(\'known bug\')")'],
    ]) {
      const result = await evaluate(xfailInAdd(body));
      expect(result.report.FAIL_TO_PASS, body.join('\n')).toMatchObject({ statuses: { [ADD]: 'xfail_by_code' }, passed: 0, failed: 1, fraction: 0 });
      expect(result, body.join('\n')).toMatchObject({ reward: 0, details: { fail_to_pass: 0, pass_to_pass: 1 } });
    }
  }, 240_000);

  it("gives 0 to a patch whose code hands the test a trusted helper that declares the failure (the patch's frame is on the way)", async () => {
    const result = await evaluate(xfailInAdd(['    from tests.helpers import not_here; not_here()']));
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ADD]: 'xfail_by_code' }, fraction: 0 });
    expect(result.reward).toBe(0);
  }, 120_000);
});
