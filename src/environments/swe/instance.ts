import { posix } from 'node:path';
import { z } from 'zod';
import { RolloutError } from '../../errors.js';

/** Longest problem statement accepted (SWE-bench's longest are ~60k characters). */
export const MAX_PROBLEM_LENGTH = 200_000;
/** Largest test patch accepted, in characters. */
export const MAX_TEST_PATCH_LENGTH = 1 << 20;
/** Most tests in FAIL_TO_PASS or PASS_TO_PASS (SWE-bench's largest PASS_TO_PASS lists have a few thousand). */
export const MAX_TESTS = 20_000;
const MAX_TEST_NAME = 2_000;
const MAX_COMMAND = 10_000;

/** SWE-bench stores the two lists as JSON-encoded strings in its parquet/CSV exports and as arrays in JSON: both work. */
const testList = (required: boolean) =>
  z.preprocess(
    (value) => {
      if (typeof value !== 'string') return value;
      try {
        return JSON.parse(value) as unknown;
      } catch {
        return value; // reported below as not an array
      }
    },
    z
      .array(z.string({ error: 'each test must be a string' }).min(1, { error: 'a test name must not be empty' }).max(MAX_TEST_NAME, { error: `a test name must be at most ${MAX_TEST_NAME} characters` }), {
        error: 'must be an array of test names (or a JSON-encoded one)',
      })
      .max(MAX_TESTS, { error: `at most ${MAX_TESTS} tests` })
      .refine((tests) => !required || tests.length > 0, { error: 'must name at least one test' }),
  );

const text = (max: number) => z.string({ error: 'must be a string' }).max(max, { error: `must be at most ${max} characters` });

/**
 * The instance, in either form:
 * - the project's own: `image`, `repo_path`, `problem_statement`, `test_command`, `FAIL_TO_PASS`, `PASS_TO_PASS`
 *   (and optionally `test_patch`, applied before the tests run);
 * - a SWE-bench / SWE-Gym / R2E row as users have it: `instance_id`, `repo`, `base_commit`, `patch`, `test_patch`,
 *   `problem_statement`, `FAIL_TO_PASS`, `PASS_TO_PASS` (arrays or JSON-encoded strings), the image named by `image`
 *   or found by `instance_id` in the server's mapping, the repository at `/testbed` as in SWE-bench's images.
 * Unknown extra fields (hints_text, created_at, version, ...) are accepted and dropped.
 */
export const sweInstanceSchema = z.object({
  instance_id: text(500).min(1, { error: 'must not be empty' }).optional(),
  image: text(4096)
    .min(1, { error: 'must not be empty' })
    // Not the host's own /usr, which the sandbox would otherwise take "host" for (see checkRequestedImage).
    .refine((image) => image !== 'host', { error: 'must be a .sif or a root file system directory inside the server\'s sandbox.imageDirs, not "host"' })
    .optional(),
  repo_path: text(4096)
    .refine((p) => posix.isAbsolute(p) && posix.normalize(p) !== '/', { error: 'must be an absolute path below /' })
    .optional(),
  problem_statement: text(MAX_PROBLEM_LENGTH).trim().min(1, { error: 'must not be empty' }),
  test_command: text(MAX_COMMAND).trim().min(1, { error: 'must not be empty' }).optional(),
  test_patch: text(MAX_TEST_PATCH_LENGTH).optional(),
  FAIL_TO_PASS: testList(true),
  PASS_TO_PASS: testList(false).optional(),
  // SWE-bench's own fields, kept for the report; the gold `patch` is never shown to the agent nor applied.
  repo: text(500).optional(),
  base_commit: text(100).optional(),
});

/** The instance after validation, in one shape whichever form it came in. */
export interface SweInstance {
  /** `instance_id` when given (SWE-bench), for reports and the image mapping. */
  instanceId: string | undefined;
  /** A .sif or a root file system directory on the server. */
  image: string;
  /** Where the repository lies inside the image (SWE-bench: /testbed). */
  repoPath: string;
  problemStatement: string;
  /** A shell command run at the repository's root that runs pytest (see DEFAULT test command in `validateSweInstance`). */
  testCommand: string;
  failToPass: string[];
  passToPass: string[];
  /** Applied after the agent's patch, with the files it touches reset first; '' when there is none. */
  testPatch: string;
  repo: string | undefined;
  baseCommit: string | undefined;
}

/** Finds the image of an instance that names none (SWE-bench rows carry no image): by instance_id, or undefined. */
export type ImageResolver = (instanceId: string) => string | undefined;

/** JSON Schema of the instance (draft 2020-12), as ListEnvironments reports it; the test lists may also be JSON text. */
export const sweInstanceJsonSchema: Record<string, unknown> = jsonSchema();

function jsonSchema(): Record<string, unknown> {
  const schema = z.toJSONSchema(sweInstanceSchema, { io: 'input', unrepresentable: 'any' }) as Record<string, unknown>;
  const properties = schema.properties as Record<string, unknown>;
  for (const list of ['FAIL_TO_PASS', 'PASS_TO_PASS']) {
    properties[list] = { anyOf: [properties[list], { type: 'string', contentMediaType: 'application/json', description: 'the array, JSON-encoded (SWE-bench exports)' }] };
  }
  return {
    ...schema,
  additionalProperties: true,
  description:
    'A repository task: the agent edits the repository in the image; eval applies its diff and the test patch in a fresh sandbox ' +
    'and runs the tests. Own form (image, repo_path, problem_statement, test_command, FAIL_TO_PASS, PASS_TO_PASS, test_patch) or a ' +
    'SWE-bench row (instance_id, repo, base_commit, patch, test_patch, problem_statement, FAIL_TO_PASS, PASS_TO_PASS).',
  };
}

/**
 * Validates an instance. Throws RolloutError.invalid('instance.<field>', reason) for the first problem found.
 * Without `test_command`, the tests are run with `python -m pytest -rA` (or python3) on the files the test names
 * point into, which needs pytest node ids (`path.py::name`); other names need an explicit command.
 */
export function validateSweInstance(instance: unknown, resolveImage?: ImageResolver): SweInstance {
  const result = sweInstanceSchema.safeParse(instance);
  if (!result.success) {
    const issue = result.error.issues[0];
    const path = issue?.path.map(String).join('.') ?? '';
    if (path === '') throw RolloutError.invalid('instance', 'must be an object with problem_statement, FAIL_TO_PASS and an image');
    const key = issue?.path[0];
    const missing = typeof key === 'string' && (instance as Record<string, unknown>)[key] === undefined;
    throw RolloutError.invalid(`instance.${path}`, missing ? 'required' : (issue?.message ?? 'invalid'));
  }
  const x = result.data;
  const image = x.image ?? (x.instance_id !== undefined ? resolveImage?.(x.instance_id) : undefined);
  if (image === undefined) {
    throw RolloutError.invalid(
      'instance.image',
      x.instance_id === undefined ? 'required (a .sif or a directory on the server)' : `required: the server maps no image to instance_id "${x.instance_id}"`,
    );
  }
  const failToPass = x.FAIL_TO_PASS;
  const passToPass = x.PASS_TO_PASS ?? [];
  let testCommand = x.test_command;
  if (testCommand === undefined) {
    const files = testFiles([...failToPass, ...passToPass]);
    if (files === undefined) throw RolloutError.invalid('instance.test_command', 'required: FAIL_TO_PASS / PASS_TO_PASS are not pytest node ids (path.py::name)');
    testCommand = `"$(command -v python || command -v python3)" -m pytest -rA ${files.map(shellQuote).join(' ')}`;
  }
  return {
    instanceId: x.instance_id,
    image,
    repoPath: posix.normalize(x.repo_path ?? '/testbed'),
    problemStatement: x.problem_statement,
    testCommand,
    failToPass,
    passToPass,
    testPatch: x.test_patch ?? '',
    repo: x.repo,
    baseCommit: x.base_commit,
  };
}

/** The test files pytest node ids point into (sorted, unique), or undefined if any name is not a node id. */
function testFiles(tests: readonly string[]): string[] | undefined {
  const files = new Set<string>();
  for (const test of tests) {
    const file = test.split('::')[0]!;
    if (!file.endsWith('.py') || file.startsWith('/') || file.split('/').includes('..')) return undefined;
    files.add(file);
  }
  return [...files].sort();
}

/** `value` as one word of a POSIX shell command line. */
export function shellQuote(value: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(value) ? value : `'${value.replace(/'/g, `'\\''`)}'`;
}
