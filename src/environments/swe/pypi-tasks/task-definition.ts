import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { RolloutError } from '../../../errors.js';

/**
 * A SWE task made from a real upstream fix, kept as data (tasks/swe/<id>/): the release of a PyPI project that
 * shipped the fix, its sdist (by file name and SHA-256: downloaded at build time, never committed), the fix as a
 * unified diff (fix.patch, the "gold patch") and its test as another (test.patch), both written against the
 * release; the image holds the release with both reverted, so FAIL_TO_PASS fails until the agent fixes the code.
 */
export const sweTaskSchema = z.strictObject({
  project: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/),
  /** The release that shipped the fix; the image is built from its sdist. */
  version: z.string().min(1),
  /** The release before it, whose changelog lacks the fix. */
  previous_version: z.string().min(1),
  sdist: z.strictObject({ filename: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]*\.tar\.gz$/), sha256: z.string().regex(/^[0-9a-f]{64}$/) }),
  /** Where the fix is announced: the changelog file in the sdist and its entry, verbatim. */
  changelog: z.strictObject({ file: z.string().min(1), entry: z.string().min(1) }),
  /** The upstream issue or pull request, e.g. "pallets/click#2500". */
  upstream: z.string().min(1),
  problem_statement: z.string().min(1),
  /** Run at the repository's root (/testbed in the image) by bash; must keep $PYTHONPATH and $PYTEST_ADDOPTS. */
  test_command: z.string().min(1),
  FAIL_TO_PASS: z.array(z.string().min(1)).min(1),
  PASS_TO_PASS: z.array(z.string().min(1)).min(1),
  /**
   * An edit of a source file (paths relative to the repository) that breaks some PASS_TO_PASS test without touching
   * what FAIL_TO_PASS checks: the CI's scripted "breaks a PASS_TO_PASS" policy applies it after the fix.
   */
  break_pass_to_pass: z.strictObject({ path: z.string().min(1), old_str: z.string().min(1), new_str: z.string() }),
});

export type SweTaskDefinition = z.output<typeof sweTaskSchema>;

/** A task with its patches, as loaded from its folder. */
export interface SweTask extends SweTaskDefinition {
  /** The folder name, e.g. "click-2500". */
  id: string;
  fixPatch: string;
  testPatch: string;
}

/** `<project>/tasks/swe`: the tasks this repository defines. */
export const DEFAULT_TASKS_DIR = fileURLToPath(new URL('../../../../tasks/swe', import.meta.url));

/** Where the repository lies in every task image (as in SWE-bench's images). */
export const TASK_REPO_PATH = '/testbed';

/** Loads every task under `dir` (one folder each: task.json, fix.patch, test.patch), sorted by id. */
export async function loadSweTasks(dir: string = DEFAULT_TASKS_DIR): Promise<SweTask[]> {
  const ids = (await readdir(dir, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => e.name).sort();
  return Promise.all(ids.map((id) => loadSweTask(join(dir, id), id)));
}

/** Loads one task folder; a malformed task.json is invalid_argument naming the file and field. */
export async function loadSweTask(folder: string, id: string): Promise<SweTask> {
  const file = join(folder, 'task.json');
  let json: unknown;
  try {
    json = JSON.parse(await readFile(file, 'utf8'));
  } catch (err) {
    throw new RolloutError('invalid_argument', `cannot read ${file}: ${(err as Error).message}`, { cause: err });
  }
  const parsed = sweTaskSchema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new RolloutError('invalid_argument', `${file}: ${issue?.path.join('.') ?? ''}: ${issue?.message ?? 'invalid'}`);
  }
  const [fixPatch, testPatch] = await Promise.all([readFile(join(folder, 'fix.patch'), 'utf8'), readFile(join(folder, 'test.patch'), 'utf8')]);
  return { ...parsed.data, id, fixPatch, testPatch };
}

/** The swe environment's instance for a task whose image was built at `image`. */
export function sweTaskInstance(task: SweTask, image: string): Record<string, unknown> {
  return {
    instance_id: task.id,
    image,
    repo_path: TASK_REPO_PATH,
    problem_statement: task.problem_statement,
    test_command: task.test_command,
    test_patch: task.testPatch,
    FAIL_TO_PASS: task.FAIL_TO_PASS,
    PASS_TO_PASS: task.PASS_TO_PASS,
  };
}
