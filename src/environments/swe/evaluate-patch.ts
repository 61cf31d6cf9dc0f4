import { RolloutError } from '../../errors.js';
import type { Sandbox } from '../../sandboxes/types.js';
import type { JsonObject } from '../json.js';
import type { Evaluation } from '../types.js';
import { gradeTests, parsePytestReport, pytestPluginSource, PYTEST_PLUGIN_MODULE, type ListGrade, type TestStatus } from './grading.js';
import type { SweInstance } from './instance.js';
import { applyPatch, applyTestPatch, prepareWorkingCopy, runTests } from './repo-ops.js';
import { touchedPaths } from './unified-diff.js';

/** Bytes of the agent's patch kept in the report (the whole patch is applied; the report shows its head). */
export const REPORT_PATCH_BYTES = 64 << 10;
/** Listed tests whose statuses the report shows one by one; past it, only the ones that did not pass. */
const REPORT_STATUSES = 2_000;

export interface EvaluatePatchOptions {
  signal?: AbortSignal;
  /** Budget of the test command, ms (bounded by the sandbox's wall clock). */
  testTimeoutMs: number;
}

/**
 * Grades a patch on a fresh sandbox of the instance's image: copy the repository, apply the patch (not applying
 * is reward 0 with the reason: the model's failure), reset the test patch's files and apply it (not applying is
 * the instance's fault: environment_error), run the test command with the report plugin, and grade by the SWE-bench
 * rule. An eval that cannot run — no repository or git in the image, a test command that never starts pytest, a
 * run past its budget, a report that does not parse — throws environment_error: never reward 0.
 *
 * details: { fail_to_pass, pass_to_pass (fractions), applied (0|1) }; report: { patch (its first
 * REPORT_PATCH_BYTES), patch_bytes, applied, apply_error?, resolved, FAIL_TO_PASS / PASS_TO_PASS: { test: status },
 * test_exit_code, test_output_tail, collect_errors }.
 */
export async function evaluatePatch(sandbox: Sandbox, instance: SweInstance, patch: string, options: EvaluatePatchOptions): Promise<Evaluation> {
  const { signal } = options;
  const dir = await prepareWorkingCopy(sandbox, instance.repoPath, { signal });
  const patchReport = reportPatch(patch);
  const applied = await applyPatch(sandbox, dir, patch, { signal });
  if (!applied.applied) {
    return {
      reward: 0,
      details: { fail_to_pass: 0, pass_to_pass: 0, applied: 0 },
      report: { ...patchReport, applied: false, apply_error: applied.reason || 'the patch does not apply', resolved: false },
    };
  }
  if (instance.testPatch !== '') {
    let paths: string[];
    try {
      paths = touchedPaths(instance.testPatch);
    } catch (err) {
      throw new RolloutError('environment_error', `the instance's test_patch is not a unified diff: ${(err as Error).message}`, { cause: err });
    }
    await applyTestPatch(sandbox, dir, instance.testPatch, paths, { signal });
  }
  const run = await runTests(sandbox, dir, instance.testCommand, { module: PYTEST_PLUGIN_MODULE, source: pytestPluginSource() }, { signal, timeoutMs: options.testTimeoutMs });
  if (run.result.timedOut) {
    throw new RolloutError('environment_error', `the tests did not finish within ${options.testTimeoutMs} ms (or the sandbox's wall clock): ${run.outputTail.slice(-1000)}`);
  }
  if (!run.started) {
    throw new RolloutError(
      'environment_error',
      `the test command did not start pytest with the report plugin (exit code ${String(run.result.exitCode)}; a command that resets PYTHONPATH or PYTEST_ADDOPTS keeps the plugin out): ${run.outputTail.slice(-1500)}`,
    );
  }
  // pytest started but ended without finishing its session (e.g. a conftest the patch broke): nothing passed.
  const report = run.report === undefined ? undefined : parsePytestReport(run.report);
  const grade = gradeTests(report?.tests ?? {}, instance.failToPass, instance.passToPass);
  return {
    reward: grade.resolved ? 1 : 0,
    details: { fail_to_pass: grade.failToPass.fraction, pass_to_pass: grade.passToPass.fraction, applied: 1 },
    report: {
      ...patchReport,
      applied: true,
      resolved: grade.resolved,
      FAIL_TO_PASS: listReport(grade.failToPass),
      PASS_TO_PASS: listReport(grade.passToPass),
      test_exit_code: run.result.exitCode,
      ...(report === undefined && { test_error: 'pytest ended without finishing its session: no test results' }),
      collect_errors: (report?.collect_errors ?? []).slice(0, 20).map((e) => ({ nodeid: e.nodeid, message: e.message.slice(-1000) })),
      test_output_tail: run.outputTail.slice(-4096),
    },
  };
}

function reportPatch(patch: string): JsonObject {
  const bytes = Buffer.byteLength(patch);
  if (bytes <= REPORT_PATCH_BYTES) return { patch, patch_bytes: bytes, patch_truncated: false };
  // Cut at a code point, so the report stays valid UTF-8.
  const head = Buffer.from(patch).subarray(0, REPORT_PATCH_BYTES).toString('utf8').replace(/\uFFFD+$/, '');
  return { patch: head, patch_bytes: bytes, patch_truncated: true };
}

function listReport(grade: ListGrade): JsonObject {
  const entries = Object.entries(grade.statuses);
  const shown: [string, TestStatus][] = entries.length <= REPORT_STATUSES ? entries : entries.filter(([, s]) => !['passed', 'xpass', 'xfail'].includes(s)).slice(0, REPORT_STATUSES);
  return {
    fraction: grade.fraction,
    passed: grade.success.length,
    failed: grade.failure.length,
    skipped: grade.skipped.length,
    statuses: Object.fromEntries(shown),
    statuses_complete: shown.length === entries.length,
  };
}
