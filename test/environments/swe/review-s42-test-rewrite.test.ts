import { describe, expect, it } from 'vitest';
import { evaluatePatch } from '../../../src/environments/swe/evaluate-patch.js';
import { validateSweInstance, type SweInstance } from '../../../src/environments/swe/instance.js';
import type { Evaluation } from '../../../src/environments/types.js';
import { sweRepo } from '../../support/swe-repo.js';

/**
 * Review s42 (helper-103): the reset puts the test files back before pytest runs, but the code under test runs inside
 * pytest and can write files: imported by a test module collected first (or a conftest), it rewrote a listed test file
 * on disk before pytest imported it (`assert add(2, 2) == 4` into `assert True`): reward 1 with add() broken, no
 * pytest internals touched. The plugin now checks the test sources (listed files, the test patch's, their test trees,
 * every conftest.py) before each import and at the end: one changed while pytest ran is no result, reward 0 with the
 * reason. Real bubblewrap sandbox of the SWE base image, pytest with the report plugin.
 */
const ADD = 'tests/test_calc.py::test_add';

const TEST_CALC = 'from calc import add\nfrom tests.helpers import expected\n\n\ndef test_add():\n    assert add(2, 2) == expected(2, 2)\n';

const REPO = {
  'calc.py': 'def add(a, b):\n    return a - b\n',
  'tests/__init__.py': '',
  // Collected before test_calc.py, and imports the package: the package's code runs before test_calc.py is imported.
  'tests/test_a.py': 'import calc\n\n\ndef test_a():\n    assert calc.add\n',
  'tests/helpers.py': 'def expected(a, b):\n    return a + b\n',
  'tests/test_calc.py': TEST_CALC,
};

const FIX = ['diff --git a/calc.py b/calc.py', '--- a/calc.py', '+++ b/calc.py', '@@ -1,2 +1,2 @@', ' def add(a, b):', '-    return a - b', '+    return a + b', ''].join('\n');

/** add() left broken, with `lines` of Python run when the package is imported. */
function atImport(lines: string[]): string {
  const all = ['', '', 'import os as _os', '_tests = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "tests")', ...lines];
  return ['diff --git a/calc.py b/calc.py', '--- a/calc.py', '+++ b/calc.py', `@@ -1,2 +1,${2 + all.length} @@`, ' def add(a, b):', '     return a - b', ...all.map((l) => `+${l}`), ''].join('\n');
}

/** Python writing `text` to `path` under tests/. */
function write(path: string, text: string): string {
  return `open(_os.path.join(_tests, ${JSON.stringify(path)}), "w").write(${JSON.stringify(text)})`;
}

describe.runIf(process.getuid?.() === 0 || process.env.CI)('code under test that rewrites the tests while pytest runs', () => {
  const fx = sweRepo('rollout-swe-rewrite-', REPO);

  async function evaluate(patch: string): Promise<Evaluation> {
    const sandbox = await fx.start();
    const instance: SweInstance = validateSweInstance({
      image: fx.image,
      problem_statement: 'add subtracts',
      test_command: 'python3 -m pytest -p no:cacheprovider tests',
      FAIL_TO_PASS: [ADD],
      PASS_TO_PASS: ['tests/test_a.py::test_a'],
    });
    return evaluatePatch(sandbox, instance, patch, { testTimeoutMs: 60_000 });
  }

  it('still rewards the honest fix (nothing flagged)', async () => {
    const result = await evaluate(FIX);
    expect(result).toMatchObject({ reward: 1, report: { resolved: true } });
    expect(result.report.test_error).toBeUndefined();
  }, 120_000);

  const rewrites: Record<string, string[]> = {
    'a listed test file rewritten to pass': [write('test_calc.py', 'def test_add():\n    assert True\n')],
    // The rewritten module puts the original back when it is imported: the disk is as it was once pytest ends.
    'a listed test file rewritten, which puts itself back once imported': [
      `_original = open(_os.path.join(_tests, "test_calc.py")).read()`,
      write('test_calc.py', 'import os\n\n\ndef test_add():\n    assert True\n\n\nopen(__file__, "w").write(ORIGINAL)\n'),
      `_p = _os.path.join(_tests, "test_calc.py"); open(_p, "w").write(open(_p).read().replace("ORIGINAL", repr(_original)))`,
    ],
    'a helper of the test tree rewritten (its expected value)': [write('helpers.py', 'def expected(a, b):\n    return a - b\n')],
  };

  for (const [what, lines] of Object.entries(rewrites)) {
    it(`gives 0 to ${what}`, async () => {
      const result = await evaluate(atImport(lines));
      expect(result, JSON.stringify(result.report)).toMatchObject({ reward: 0, report: { resolved: false, test_error: expect.stringContaining('test sources were changed while pytest ran') } });
      expect(result.report.tampered).toEqual([expect.stringMatching(/^\/work\/testbed\/tests\/(test_calc|helpers)\.py$/)]);
    }, 120_000);
  }
});
