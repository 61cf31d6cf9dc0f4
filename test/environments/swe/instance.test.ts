import { describe, expect, it } from 'vitest';
import { validateSweInstance } from '../../../src/environments/swe/instance.js';
import { RolloutError } from '../../../src/errors.js';

const own = {
  image: '/images/task.sif',
  repo_path: '/testbed',
  problem_statement: 'add() subtracts',
  test_command: 'python3 -m pytest tests',
  FAIL_TO_PASS: ['tests/test_calc.py::test_add'],
  PASS_TO_PASS: ['tests/test_calc.py::test_mul[1 2]'],
};

/** A SWE-bench row as its JSON/parquet exports carry it: the test lists JSON-encoded, no image, no command. */
const sweBench = {
  instance_id: 'astropy__astropy-12907',
  repo: 'astropy/astropy',
  base_commit: 'd16bfe05a744909de4b27f5875fe0d4ed41ce607',
  patch: 'diff --git a/astropy/modeling/separable.py b/astropy/modeling/separable.py (the gold fix)',
  test_patch: 'diff --git a/astropy/modeling/tests/test_separable.py ...',
  problem_statement: 'Modeling separability_matrix does not compute separability correctly for nested CompoundModels',
  hints_text: '',
  created_at: '2022-03-03T15:14:54Z',
  version: '4.3',
  FAIL_TO_PASS: '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]',
  PASS_TO_PASS: '["astropy/modeling/tests/test_separable.py::test_coord_matrix", "astropy/modeling/tests/test_core.py::test_custom_model[0 1]"]',
  environment_setup_commit: '298ccb478e6bf092953bca67a3d29dc6c35f6752',
};

function fieldOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(RolloutError);
    expect((err as RolloutError).code).toBe('invalid_argument');
    return (err as RolloutError).field;
  }
  return undefined;
}

describe('SWE instance validation', () => {
  it('accepts the project’s own form as given', () => {
    expect(validateSweInstance(own)).toMatchObject({
      image: '/images/task.sif',
      repoPath: '/testbed',
      testCommand: 'python3 -m pytest tests',
      failToPass: own.FAIL_TO_PASS,
      passToPass: own.PASS_TO_PASS,
      testPatch: '',
    });
  });

  it('accepts a SWE-bench row with JSON-encoded test lists, its image from the server mapping and a pytest command from the node ids', () => {
    const instance = validateSweInstance(sweBench, (id) => `/images/${id}.sif`);
    expect(instance).toMatchObject({
      instanceId: 'astropy__astropy-12907',
      image: '/images/astropy__astropy-12907.sif',
      repoPath: '/testbed',
      failToPass: ['astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]'],
      passToPass: ['astropy/modeling/tests/test_separable.py::test_coord_matrix', 'astropy/modeling/tests/test_core.py::test_custom_model[0 1]'],
      testPatch: sweBench.test_patch,
    });
    expect(instance.testCommand).toBe('"$(command -v python || command -v python3)" -m pytest -rA astropy/modeling/tests/test_core.py astropy/modeling/tests/test_separable.py');
    // The gold patch never reaches the environment's instance.
    expect(JSON.stringify(instance)).not.toContain('the gold fix');
  });

  it('names the offending field as instance.<field>', () => {
    expect(fieldOf(() => validateSweInstance('not an object'))).toBe('instance');
    expect(fieldOf(() => validateSweInstance({ ...own, problem_statement: undefined }))).toBe('instance.problem_statement');
    expect(fieldOf(() => validateSweInstance({ ...own, problem_statement: '   ' }))).toBe('instance.problem_statement');
    expect(fieldOf(() => validateSweInstance({ ...own, FAIL_TO_PASS: [] }))).toBe('instance.FAIL_TO_PASS');
    expect(fieldOf(() => validateSweInstance({ ...own, FAIL_TO_PASS: '["unterminated' }))).toBe('instance.FAIL_TO_PASS');
    expect(fieldOf(() => validateSweInstance({ ...own, PASS_TO_PASS: [1, 2] }))).toBe('instance.PASS_TO_PASS.0');
    expect(fieldOf(() => validateSweInstance({ ...own, repo_path: 'testbed' }))).toBe('instance.repo_path');
    expect(fieldOf(() => validateSweInstance({ ...own, repo_path: '/' }))).toBe('instance.repo_path');
    expect(fieldOf(() => validateSweInstance({ ...own, test_patch: 42 }))).toBe('instance.test_patch');
    expect(fieldOf(() => validateSweInstance({ ...own, image: undefined }))).toBe('instance.image');
    // A SWE-bench row the server has no image for.
    expect(fieldOf(() => validateSweInstance(sweBench, () => undefined))).toBe('instance.image');
    // Test names that are not pytest node ids need an explicit command.
    expect(fieldOf(() => validateSweInstance({ ...own, test_command: undefined, FAIL_TO_PASS: ['test_add (tests.CalcTest)'] }))).toBe('instance.test_command');
  });

  it('says why in the message', () => {
    expect(() => validateSweInstance({ ...own, FAIL_TO_PASS: 'not json' })).toThrow(/instance\.FAIL_TO_PASS: must be an array of test names \(or a JSON-encoded one\)/);
    expect(() => validateSweInstance(sweBench, () => undefined)).toThrow(/maps no image to instance_id "astropy__astropy-12907"/);
  });
});
