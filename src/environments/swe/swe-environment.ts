import { existsSync } from 'node:fs';
import { isAbsolute, join } from 'node:path';
import { RolloutError } from '../../errors.js';
import type { SandboxLimits } from '../../sandboxes/types.js';
import type { ChatMessage } from '../../tokens/types.js';
import { defaultToolRegistry, type ToolRegistry } from '../../tools/registry.js';
import type { Environment, Evaluation } from '../types.js';
import { evaluatePatch } from './evaluate-patch.js';
import { shellQuote, sweInstanceJsonSchema, validateSweInstance, type ImageResolver, type SweInstance } from './instance.js';
import { diffWorkingCopy, prepareWorkingCopy, UnreadableWorkingCopy, workingCopyPath } from './repo-ops.js';

/** Tools the SWE environment offers, by name; the system prompt refers to them. */
export const SWE_TOOL_NAMES = ['bash', 'str_replace_editor', 'finish'] as const;

/** Largest agent patch evaluated; a larger one is reward 0 (an agent that rewrote the repository failed the task). */
export const MAX_PATCH_BYTES = 4 << 20;

export const SWE_SYSTEM_PROMPT = [
  'You are a software engineer resolving an issue in a code repository inside a sandbox.',
  'Tools: `bash` runs shell commands in a persistent shell (state carries over between calls); `str_replace_editor` views, creates and edits files (view, create, str_replace, insert, undo_edit; use absolute paths); call `finish` when you are done.',
  'Make the smallest change to the non-test files of the repository that resolves the issue. You may write and run scripts to reproduce it.',
  'When you finish, your changes are taken as the diff of the repository against its original state and graded by hidden tests.',
].join('\n');

export interface SweEnvironmentOptions {
  /** Where `bash`, `str_replace_editor` and `finish` come from (default: the built-in tool registry). */
  toolRegistry?: ToolRegistry;
  /** Replaces {@link SWE_SYSTEM_PROMPT}. */
  systemPrompt?: string;
  /**
   * Images of instances that name none (SWE-bench rows): a function of instance_id, or a directory holding
   * `<instance_id>.sif` or `<instance_id>/` (a root file system). An instance's own `image` wins.
   */
  images?: ImageResolver | string;
  /** Limits of the agent's and the eval's sandboxes (default 2 GiB memory, 1 GiB workspace, 256 processes). */
  limits?: Partial<SandboxLimits>;
  /**
   * Budget of one run of the test command at eval, ms (default 10 minutes). Tests still running past it with the patch
   * applied are reward 0 with `tests_timed_out` (SWE-bench: unresolved). The environment's default eval budget is
   * this plus {@link EVAL_OVERHEAD_MS} (fresh sandbox, diff, apply), so a hanging test suite is the policy outcome
   * it is; a task that sets a smaller `limits.eval_timeout_ms` gets TIMEOUT when its own budget ends first.
   */
  testTimeoutMs?: number;
}

/** Eval work around the test run: starting the fresh sandbox, reading the diff, applying both patches. */
export const EVAL_OVERHEAD_MS = 120_000;

const DEFAULT_LIMITS: Partial<SandboxLimits> = { memoryMb: 2048, diskMb: 1024, maxProcesses: 256 };

/**
 * The "swe" environment: an issue in a repository inside an image; the agent edits it with bash and the file editor;
 * eval takes the agent's `git diff` (against the image's state), applies it with the test patch in a fresh sandbox
 * from the same image, runs the test command under pytest with a reporting plugin, and grades per test by the
 * SWE-bench rule (every FAIL_TO_PASS passes, every PASS_TO_PASS still passes) — see `evaluatePatch`.
 *
 * Images are read-only: the repository at `repo_path` (SWE-bench: /testbed) is copied into the workspace
 * (`<workdir>/<basename>`, e.g. /work/testbed) at init, and the agent is told to work there. Tests run at the copy's
 * root; a package installed in develop mode from `repo_path` is shadowed by the copy when the test command runs
 * `python -m pytest` from the root (sys.path[0]) or puts the copy's source directory first on PYTHONPATH.
 * Sandboxes have no network. An image outside the server's sandbox.imageDirs is refused at submit whether it exists or
 * not, one missing inside them is refused at submit too (SANDBOX_ERROR if it goes missing before init); an eval that
 * cannot run is ENVIRONMENT_ERROR.
 *
 * @example
 * const swe = createSweEnvironment({ images: '/data/swe-bench-images' }); // <instance_id>.sif inside
 * const instance = swe.validate({ instance_id: 'astropy__astropy-12907', problem_statement: '...', FAIL_TO_PASS: '["a.py::t"]', ... });
 */
export function createSweEnvironment(options: SweEnvironmentOptions = {}): Environment<SweInstance> {
  const systemPrompt = options.systemPrompt ?? SWE_SYSTEM_PROMPT;
  const toolRegistry = options.toolRegistry ?? defaultToolRegistry();
  const missing = SWE_TOOL_NAMES.filter((name) => !toolRegistry.has(name));
  if (missing.length > 0) throw new RolloutError('failed_precondition', `swe environment needs tools: ${missing.join(', ')}`);
  // Shared by every sample: the editor keys its undo history by sandbox, bash uses the sandbox's own shell.
  const tools = toolRegistry.create(SWE_TOOL_NAMES);
  const resolveImage = imageResolver(options.images);
  const limits = { ...DEFAULT_LIMITS, ...options.limits };
  const testTimeoutMs = options.testTimeoutMs ?? 600_000;

  return {
    name: 'swe',
    description:
      'Resolve an issue in a repository (own instances or SWE-bench / SWE-Gym / R2E rows, image as .sif or directory); bash and ' +
      'file editor tools; reward 1 when the diff makes every FAIL_TO_PASS test pass and keeps every PASS_TO_PASS test passing.',
    instanceSchema: sweInstanceJsonSchema,
    toolNames: SWE_TOOL_NAMES,
    stageTimeouts: { evalMs: testTimeoutMs + EVAL_OVERHEAD_MS },

    validate: (instance) => validateSweInstance(instance, resolveImage),

    sandbox(instance) {
      // No existence check here: it would run before the server's sandbox.imageDirs check (at submit and at init) and
      // tell a trainer whether any path exists on the server. Existence is checked after it (validate-task.ts, the driver).
      return { image: instance.image, network: false, limits };
    },

    async init({ instance, sandbox, signal }): Promise<{ messages: ChatMessage[] }> {
      const dir = await prepareWorkingCopy(sandbox, instance.repoPath, { signal });
      // The agent's shell starts in the repository.
      await sandbox.shell().run(`cd ${shellQuote(dir)}`, { signal });
      return { messages: prompt(instance, dir) };
    },

    tools: () => tools,

    async evaluate({ instance, sandbox, signal, openSandbox }): Promise<Evaluation> {
      if (!openSandbox) throw new RolloutError('environment_error', 'the swe environment needs openSandbox to evaluate in a fresh sandbox');
      let diff: { patch: string; bytes: number };
      try {
        diff = await diffWorkingCopy(sandbox, instance.repoPath, workingCopyPath(sandbox, instance.repoPath), MAX_PATCH_BYTES, { signal });
      } catch (err) {
        if (!(err instanceof UnreadableWorkingCopy)) throw err;
        // The agent deleted its working copy or made files unreadable: there is no patch to grade, by its doing.
        return { reward: 0, details: { fail_to_pass: 0, pass_to_pass: 0, applied: 0 }, report: { patch: '', patch_bytes: 0, applied: false, apply_error: err.message, resolved: false } };
      }
      if (diff.bytes > MAX_PATCH_BYTES) {
        return {
          reward: 0,
          details: { fail_to_pass: 0, pass_to_pass: 0, applied: 0 },
          report: { patch: '', patch_bytes: diff.bytes, applied: false, apply_error: `the patch has ${diff.bytes} bytes, more than ${MAX_PATCH_BYTES}`, resolved: false },
        };
      }
      const fresh = await openSandbox();
      return evaluatePatch(fresh, instance, diff.patch, { signal, testTimeoutMs });
    },
  };

  function prompt(instance: SweInstance, dir: string): ChatMessage[] {
    return [
      { role: 'system', content: systemPrompt },
      { role: 'user', content: `<issue>\n${instance.problemStatement}\n</issue>\n\nThe repository is at ${dir} (your shell is there). Resolve the issue by editing its files.` },
    ];
  }
}

function imageResolver(images: SweEnvironmentOptions['images']): ImageResolver | undefined {
  if (typeof images === 'function' || images === undefined) return images;
  if (!isAbsolute(images)) throw new RolloutError('invalid_argument', `swe images directory must be absolute: ${images}`);
  return (instanceId) => {
    if (!/^[A-Za-z0-9_.-]+$/.test(instanceId) || instanceId.startsWith('.')) return undefined;
    const sif = join(images, `${instanceId}.sif`);
    if (existsSync(sif)) return sif;
    const dir = join(images, instanceId);
    return existsSync(dir) ? dir : undefined;
  };
}
