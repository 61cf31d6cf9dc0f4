import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { RolloutError } from '../../errors.js';

/**
 * A test's outcome as the pytest plugin reports it, or 'missing' when the run never reported the test. `xfail_by_code`:
 * an imperative xfail (`pytest.xfail()`) raised through code the agent's patch changed, or code without a file (exec),
 * i.e. the code under test declaring its own test an expected failure: a failure (see gradeTests).
 */
export type TestStatus = 'passed' | 'failed' | 'error' | 'skipped' | 'xfail' | 'xpass' | 'xfail_by_code' | 'missing';

/** The statuses that count as passing (SWE-bench's rule: passed, xpass, xfail). */
export const PASSING_STATUSES: readonly TestStatus[] = ['passed', 'xpass', 'xfail'];

/** Module name of the pytest plugin (rollout_swe_report.py beside this file), loaded with `-p`. */
export const PYTEST_PLUGIN_MODULE = 'rollout_swe_report';

let pluginSource: string | undefined;
/** The plugin's Python source, written into each eval sandbox (read once from the file beside this one). */
export function pytestPluginSource(): string {
  pluginSource ??= readFileSync(new URL(`./${PYTEST_PLUGIN_MODULE}.py`, import.meta.url), 'utf8');
  return pluginSource;
}

const reportSchema = z.object({
  version: z.literal(1),
  exitstatus: z.number().int(),
  tests: z.record(z.string(), z.enum(['passed', 'failed', 'error', 'skipped', 'xfail', 'xpass', 'xfail_by_code'])),
  collect_errors: z.array(z.object({ nodeid: z.string(), message: z.string() })).default([]),
  /** Test sources changed while pytest ran (see rollout_swe_report.py): no result counts then. */
  tampered: z.array(z.string()).max(50).default([]),
});

/** What one pytest session reported. */
export type PytestReport = z.output<typeof reportSchema>;

/**
 * Reads the plugin's JSON report. It was written inside the sandbox by code the agent's patch may have changed
 * (a conftest can reach the plugin's globals), so it is validated here; a report that does not parse is an
 * environment_error naming why, never a silent zero.
 */
export function parsePytestReport(json: string): PytestReport {
  let value: unknown;
  try {
    value = JSON.parse(json);
  } catch (err) {
    throw new RolloutError('environment_error', `the pytest report is not JSON: ${(err as Error).message}`, { cause: err });
  }
  const result = reportSchema.safeParse(value);
  if (!result.success) throw new RolloutError('environment_error', `the pytest report is malformed: ${result.error.issues[0]?.message ?? 'invalid'}`);
  return result.data;
}

/** One list's outcome under the SWE-bench rule. */
export interface ListGrade {
  /** Tests that passed (passed, xpass, or xfail as SWE-bench counts it). */
  success: string[];
  /** Tests that failed, errored, were declared expected failures by the patch's code (xfail_by_code), or were never reported. */
  failure: string[];
  /** Tests that were skipped (also in `failure`: a listed test must pass, see gradeTests). */
  skipped: string[];
  /** success / (success + failure); 1 when both are empty (SWE-bench's convention). */
  fraction: number;
  /** Each listed test's status. */
  statuses: Record<string, TestStatus>;
}

export interface Grade {
  failToPass: ListGrade;
  passToPass: ListGrade;
  /** The SWE-bench rule: every FAIL_TO_PASS now passes and every PASS_TO_PASS still passes. */
  resolved: boolean;
}

/**
 * Grades a test run the way SWE-bench's harness does (swebench/harness/grading.py): a test passes when reported
 * PASSED or XFAIL, fails when FAILED or ERROR or not reported at all (a test the run never reached, e.g. because
 * its module no longer imports, counts against the patch). Resolved when both fractions are 1.
 *
 * One departure: a skipped test fails, in either list. SWE-bench leaves skipped tests out, and a list whose tests are
 * all left out counts as passing, so a patch that makes the tests it should fix skip (unittest.SkipTest raised in the
 * code they call) would be resolved without fixing anything, and one that breaks a PASS_TO_PASS test could hide it
 * the same way: rewards forged, not earned. Every listed test passed with the reference fix in the instance's
 * environment (that is how the lists are made), so an honest patch never meets this; an instance whose image skips
 * a listed test scores 0 for every patch, the gold one included, and its report shows the skips. The same for an xfail:
 * an expected failure the tests declare (a marker, pytest.xfail() in the test or its helpers and fixtures) passes, one
 * raised through the patch's code (`xfail_by_code`, pytest.xfail() in the package) fails.
 */
export function gradeTests(tests: Readonly<Record<string, TestStatus>>, failToPass: readonly string[], passToPass: readonly string[]): Grade {
  const fail = gradeList(tests, failToPass);
  const pass = gradeList(tests, passToPass);
  return { failToPass: fail, passToPass: pass, resolved: fail.fraction === 1 && pass.fraction === 1 };
}

function gradeList(tests: Readonly<Record<string, TestStatus>>, names: readonly string[]): ListGrade {
  const grade: ListGrade = { success: [], failure: [], skipped: [], fraction: 1, statuses: {} };
  for (const name of names) {
    const status: TestStatus = Object.hasOwn(tests, name) ? tests[name]! : 'missing';
    grade.statuses[name] = status;
    if (PASSING_STATUSES.includes(status)) grade.success.push(name);
    else grade.failure.push(name);
    if (status === 'skipped') grade.skipped.push(name);
  }
  const counted = grade.success.length + grade.failure.length;
  grade.fraction = counted === 0 ? 1 : grade.success.length / counted;
  return grade;
}
