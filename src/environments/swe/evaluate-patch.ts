import { RolloutError } from '../../errors.js';
import type { Sandbox } from '../../sandboxes/types.js';
import type { JsonObject } from '../json.js';
import type { Evaluation } from '../types.js';
import { gradeTests, parsePytestReport, PASSING_STATUSES, pytestPluginSource, PYTEST_PLUGIN_MODULE, type ListGrade, type PytestReport, type TestStatus } from './grading.js';
import type { SweInstance } from './instance.js';
import { applyPatch, applyTestPatch, listPatchedPaths, listProtectedPaths, prepareWorkingCopy, resetTestInfrastructure } from './repo-ops.js';
import { runTests } from './test-run.js';
import { touchedPaths } from './patch-paths.js';

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
 * is reward 0 with the reason: the model's failure), put back the test infrastructure and test files it changed,
 * reset the test patch's files and apply it (not applying is the instance's fault, environment_error, unless it
 * applies to the base alone: then the patch is in its way, reward 0 with the reason in test_error), run the test
 * command with the report plugin, and grade by the SWE-bench rule (a skipped listed test fails). Tests that start and
 * then run past `testTimeoutMs` with the patch applied are the patch's fault, as in SWE-bench (unresolved): reward 0
 * with `tests_timed_out`, what they reported before the kill graded as usual. An eval that cannot run — no repository
 * or git in the image, a test command that never starts pytest, within the budget or at all, without the patch
 * too (with it alone, the patch kept pytest from starting: reward 0) — throws environment_error: never reward 0; tests cut short by the task's own time running out throw
 * deadline_exceeded (TIMEOUT). A report the patch's code broke or rewrote is reward 0, never an environment failure.
 *
 * details: { fail_to_pass, pass_to_pass (fractions), applied (0|1), tests_timed_out (0|1) }; report: { patch (its
 * first REPORT_PATCH_BYTES), patch_bytes, applied, apply_error?, resolved, FAIL_TO_PASS / PASS_TO_PASS: { test:
 * status }, test_exit_code, tests_timed_out, test_error?, test_output_tail, collect_errors, test_infrastructure_reset
 * (the paths put back before the tests ran, see resetTestInfrastructure), tampered? (test sources changed while pytest
 * ran: reward 0) }.
 */
export async function evaluatePatch(sandbox: Sandbox, instance: SweInstance, patch: string, options: EvaluatePatchOptions): Promise<Evaluation> {
  const { signal } = options;
  const dir = await prepareWorkingCopy(sandbox, instance.repoPath, { signal });
  const patchHead = reportPatch(patch);
  const applied = await applyPatch(sandbox, dir, patch, { signal });
  if (!applied.applied) {
    return {
      reward: 0,
      details: { fail_to_pass: 0, pass_to_pass: 0, applied: 0 },
      report: { ...patchHead, applied: false, apply_error: applied.reason || 'the patch does not apply', resolved: false },
    };
  }
  let testPatchPaths: string[] = [];
  try {
    testPatchPaths = touchedPaths(instance.testPatch);
  } catch (err) {
    throw new RolloutError('environment_error', `the instance's test_patch is not a unified diff: ${(err as Error).message}`, { cause: err });
  }
  // Test infrastructure the patch changed (conftest.py, pytest's configuration, sitecustomize, .pth, entry points) and
  // the files of the listed tests are put back as the image has them before the tests run: changed, they would let the
  // patch write the results (or the tests) instead of earning them. Restored rather than a reward 0, as SWE-bench
  // restores the test files: the patch is graded on the rest.
  const testFiles = [...new Set([...listedTestFiles(instance), ...testPatchPaths])];
  const reset = await resetTestInfrastructure(sandbox, instance.repoPath, dir, testFiles, { signal });
  const patchReport = { ...patchHead, test_infrastructure_reset: reset.paths, ...(reset.count > reset.paths.length && { test_infrastructure_reset_count: reset.count }) };
  if (reset.problem !== undefined) return testsNotRun(patchReport, { test_error: `the test infrastructure could not be put back as the image has it: ${reset.problem}` });
  // What the patch changed, for the plugin: SWE-bench counts an xfail as passing, so an imperative xfail raised through
  // the patch's code (the code under test declaring its own test an expected failure) is xfail_by_code, a failure.
  const patchedList = await listPatchedPaths(sandbox, dir, { signal });
  if (instance.testPatch !== '') {
    const tests = await applyTestPatch(sandbox, dir, instance.testPatch, testPatchPaths, { signal });
    if (!tests.applied) {
      // It applies to the base, so the agent's patch is in the way: the tests cannot run, and that is the patch's doing.
      return testsNotRun(patchReport, { test_error: `the instance's test_patch does not apply on top of the patch (it applies to the base): ${tests.reason || 'git apply failed'}` });
    }
  }
  // The test sources as they are now: the plugin reports those the code under test changes while pytest runs.
  const protectedList = await listProtectedPaths(sandbox, dir, testFiles, { signal });
  const run = await runTests(sandbox, dir, instance.testCommand, { module: PYTEST_PLUGIN_MODULE, source: pytestPluginSource() }, { signal, timeoutMs: options.testTimeoutMs, patchedList, protectedList });
  const timedOut = run.result.timedOut;
  if (timedOut && run.result.durationMs + 100 < options.testTimeoutMs) {
    // Cut short by the sandbox's wall clock, i.e. the task's total time ran out: the budget's fault, not the patch's.
    // (Timers may fire a millisecond early and durations are rounded, hence the slack.)
    throw new RolloutError('deadline_exceeded', `the task's time ran out after ${Math.round(run.result.durationMs)} ms of tests (test budget ${options.testTimeoutMs} ms)`);
  }
  if (!run.started) {
    // Whose doing: a patch can keep pytest from starting (a module at the root shadowing one pytest imports, a broken
    // module of a repository pytest itself depends on). That must not become an environment failure the trainer drops
    // (the policy would escape a 0), so the same command is tried on the repository without the patch: when pytest
    // starts there, the patch is at fault. So when it did not start in time: a module of the patch that pytest imports
    // before the plugin (a root argparse.py that sleeps) runs before the started line, so the budget ending first is
    // no sign that nothing of the patch ran.
    if (await pytestStartsWithoutPatch(sandbox, instance, { signal, timeoutMs: options.testTimeoutMs })) {
      const when = timedOut ? ` within ${options.testTimeoutMs} ms` : '';
      return testsNotRun(patchReport, {
        test_exit_code: run.result.exitCode,
        test_error: `pytest did not start${when} with the patch applied (it does without it): the patch broke the test run`,
        test_output_tail: run.outputTail.slice(-4096),
      });
    }
    const why = timedOut ? `did not start pytest within ${options.testTimeoutMs} ms` : `did not start pytest with the report plugin (exit code ${String(run.result.exitCode)}`;
    throw new RolloutError(
      'environment_error',
      `the test command ${why}${timedOut ? '' : '; a command that resets PYTHONPATH or PYTEST_ADDOPTS, or does not pass on fds 3 and 4, keeps the plugin out)'}: ${run.outputTail.slice(-1500)}`,
    );
  }
  // pytest started but ended without finishing its session (e.g. a conftest the patch broke, or the tests ran past
  // their budget): what it did not report did not pass. Once pytest has started, the report is the patch's to break
  // too (its code runs inside pytest as the same user: it can overwrite the file): a report changed after the plugin
  // wrote it, not JSON, malformed or too large is no results — reward 0 with test_error saying why — never an environment failure, which
  // the trainer would filter out (the policy could opt out of a 0).
  let report: PytestReport | undefined;
  let reportProblem = run.reportProblem;
  if (run.report !== undefined) {
    try {
      report = parsePytestReport(run.report);
    } catch (err) {
      reportProblem = RolloutError.from(err).message.slice(0, 500);
    }
  }
  const grade = gradeTests(report?.tests ?? {}, instance.failToPass, instance.passToPass);
  // Test sources the code under test rewrote while pytest ran (before pytest imported them): the results are not the tests'.
  const tampered = report?.tampered ?? [];
  // SWE-bench's rule: tests that run past the timeout with the patch applied leave the instance unresolved.
  const resolved = grade.resolved && !timedOut && tampered.length === 0;
  const testError = timedOut
    ? `the tests did not finish within ${options.testTimeoutMs} ms with the patch applied: unresolved (SWE-bench's rule for a timeout)`
    : tampered.length > 0
      ? `test sources were changed while pytest ran (by the code under test): ${tampered.slice(0, 10).join(', ')}`
      : reportProblem !== undefined
      ? `the pytest report could not be used (${reportProblem}): no test results`
      : report === undefined
        ? 'pytest ended without finishing its session: no test results'
        : undefined;
  return {
    reward: resolved ? 1 : 0,
    details: { fail_to_pass: grade.failToPass.fraction, pass_to_pass: grade.passToPass.fraction, applied: 1, tests_timed_out: timedOut ? 1 : 0 },
    report: {
      ...patchReport,
      applied: true,
      resolved,
      FAIL_TO_PASS: listReport(grade.failToPass),
      PASS_TO_PASS: listReport(grade.passToPass),
      test_exit_code: run.result.exitCode,
      tests_timed_out: timedOut,
      ...(testError !== undefined && { test_error: testError }),
      ...(tampered.length > 0 && { tampered }),
      collect_errors: (report?.collect_errors ?? []).slice(0, 20).map((e) => ({ nodeid: e.nodeid, message: e.message.slice(-1000) })),
      test_output_tail: run.outputTail.slice(-4096),
    },
  };
}

/** Reward 0 for a patch that applied but kept the tests from running (`why`: what the report adds). */
function testsNotRun(patchReport: JsonObject, why: JsonObject): Evaluation {
  return {
    reward: 0,
    details: { fail_to_pass: 0, pass_to_pass: 0, applied: 1, tests_timed_out: 0 },
    report: { ...patchReport, applied: true, resolved: false, ...why },
  };
}

/** Whether the test command starts pytest with the report plugin on a fresh copy of the image's repository. */
async function pytestStartsWithoutPatch(sandbox: Sandbox, instance: SweInstance, options: { signal?: AbortSignal; timeoutMs: number }): Promise<boolean> {
  const dir = await prepareWorkingCopy(sandbox, instance.repoPath, { signal: options.signal });
  const run = await runTests(sandbox, dir, instance.testCommand, { module: PYTEST_PLUGIN_MODULE, source: pytestPluginSource() }, { ...options, collectOnly: true });
  return run.started;
}

/** The files the listed tests live in, from their pytest node ids (`path.py::name`); other names name no file. */
function listedTestFiles(instance: SweInstance): string[] {
  const files = new Set<string>();
  for (const test of [...instance.failToPass, ...instance.passToPass]) {
    const file = test.split('::')[0]!;
    if (file.endsWith('.py') && !file.startsWith('/') && !file.split('/').includes('..')) files.add(file);
  }
  return [...files];
}

function reportPatch(patch: string): JsonObject {
  const bytes = Buffer.byteLength(patch);
  if (bytes <= REPORT_PATCH_BYTES) return { patch, patch_bytes: bytes, patch_truncated: false };
  // Cut at a code point, so the report stays valid UTF-8.
  // Trailing U+FFFD (a character cut by the byte bound) dropped by a scan from the end: `replace(/\uFFFD+$/, '')`
  // is quadratic in a long run of them elsewhere in the patch.
  const decoded = Buffer.from(patch).subarray(0, REPORT_PATCH_BYTES).toString('utf8');
  let end = decoded.length;
  while (end > 0 && decoded.charCodeAt(end - 1) === 0xfffd) end--;
  const head = decoded.slice(0, end);
  return { patch: head, patch_bytes: bytes, patch_truncated: true };
}

function listReport(grade: ListGrade): JsonObject {
  const entries = Object.entries(grade.statuses);
  const shown: [string, TestStatus][] = entries.length <= REPORT_STATUSES ? entries : entries.filter(([, s]) => !PASSING_STATUSES.includes(s)).slice(0, REPORT_STATUSES);
  return {
    fraction: grade.fraction,
    passed: grade.success.length,
    failed: grade.failure.length,
    skipped: grade.skipped.length,
    statuses: Object.fromEntries(shown),
    statuses_complete: shown.length === entries.length,
  };
}
