import { existsSync, readdirSync, realpathSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RolloutError } from '../../errors.js';
import type { Sandbox, SandboxMount } from '../../sandboxes/types.js';

/**
 * The `math-verify` checker: Hugging Face's math-verify (PyPI, pinned in python/math-verify/requirements.txt) run
 * inside a sandbox. Why a sandbox: it parses model output with sympy, which can take unbounded time and memory on
 * adversarial text (`\frac{1}{2}^{10^{10^{10}}}`), so it runs with no network, under the sandbox's memory/process
 * limits and a wall-clock timeout, never in the server process. The math environment opens a fresh sandbox for it
 * (`openSandbox`), not the episode's, so nothing the model left running there can break or sway the check.
 *
 * How: scripts/setup.sh installs the packages into a project-local venv (`.venvs/math-verify`, or
 * ROLLOUT_MATH_VERIFY_VENV) with their bytecode compiled. The venv's site-packages and
 * python/math-verify/check_answers.py are bound read-only into the sandbox at {@link MATH_VERIFY_MOUNT} (the math
 * environment asks for these mounts when it opens the grading sandbox), and the sandbox's own `python3` runs the
 * script with `-I -S`: only those packages are imported, nothing from the sandbox's workspace. Every package is pure
 * Python, so the image's interpreter imports them whatever its patch version; with the same minor version as the
 * interpreter that installed them (3.11 on the host and in the default bookworm image) the compiled bytecode is
 * used and a check costs about 0.5 s (the sympy import), otherwise about 2 s more.
 */

/**
 * Where the packages and the script appear inside the sandbox: a top-level directory of its own, because an image's
 * top-level directories (/opt, /usr) are its read-only file system, where no mount point can be made.
 */
export const MATH_VERIFY_MOUNT = '/rollout/math-verify';
const DEFAULT_VENV = fileURLToPath(new URL('../../../.venvs/math-verify', import.meta.url));
const SCRIPT_DIR = fileURLToPath(new URL('../../../python/math-verify', import.meta.url));
const SCRIPT = 'check_answers.py';

/** Default time for one check (import + parse + verify; math-verify's own timeouts are 5 s each). */
export const MATH_VERIFY_TIMEOUT_MS = 30_000;

/** An installed math-verify: host paths of what gets bound into the sandbox. */
export interface MathVerifyInstallation {
  /** The venv's site-packages (real path), holding math_verify, latex2sympy2_extended, sympy, antlr4, mpmath. */
  sitePackages: string;
  /** The folder holding check_answers.py. */
  scriptDir: string;
}

/**
 * Finds math-verify in `venv` (default ROLLOUT_MATH_VERIFY_VENV, else the project's .venvs/math-verify); undefined
 * when it is not installed there. Real paths, so a symlinked .venvs binds what it points at.
 */
export function findMathVerify(venv = process.env.ROLLOUT_MATH_VERIFY_VENV ?? DEFAULT_VENV): MathVerifyInstallation | undefined {
  try {
    const lib = join(realpathSync(venv), 'lib');
    for (const entry of readdirSync(lib)) {
      const sitePackages = join(lib, entry, 'site-packages');
      if (/^python3\.\d+$/.test(entry) && existsSync(join(sitePackages, 'math_verify', '__init__.py'))) {
        return { sitePackages, scriptDir: realpathSync(SCRIPT_DIR) };
      }
    }
  } catch {
    // no such venv
  }
  return undefined;
}

/** The read-only binds that make {@link runMathVerify} work in a sandbox. */
export function mathVerifyMounts(installation: MathVerifyInstallation): SandboxMount[] {
  return [
    { source: installation.sitePackages, target: `${MATH_VERIFY_MOUNT}/site-packages`, readOnly: true },
    { source: installation.scriptDir, target: `${MATH_VERIFY_MOUNT}/bin`, readOnly: true },
  ];
}

/** One comparison. `raw` passes both texts to math-verify as they are (no \boxed{} added, both extraction configs). */
export interface MathVerifyPair {
  gold: string;
  pred: string;
  raw?: boolean;
}

/** math-verify's verdict and what it parsed each side as (sympy's str, then the extracted text). */
export interface MathVerifyVerdict {
  equivalent: boolean;
  gold: string[];
  pred: string[];
  /**
   * Why the prediction has no verdict of math-verify's (its check ran past the script's hard bound or died): then
   * `equivalent` is false. The answer's doing, never the infrastructure's: the bound is per prediction, after the
   * import and the gold's parse, and leaves math-verify's own timeouts room to end an honest check first.
   */
  limit?: string;
}

/**
 * Runs math-verify on `pairs` in `sandbox` (which must have {@link mathVerifyMounts}) and returns one verdict per
 * pair, in order. A pathological answer is "not equivalent" (math-verify's own timeouts, and the script's hard bound
 * of about 15 s on each prediction's check, reported as `limit`); the script failing, a line it could not read, or the
 * whole run exceeding `timeoutMs` is a RolloutError('environment_error'): an infrastructure failure, never a reward
 * of 0.
 */
export async function runMathVerify(
  sandbox: Sandbox,
  pairs: readonly MathVerifyPair[],
  options: { signal?: AbortSignal; timeoutMs?: number } = {},
): Promise<MathVerifyVerdict[]> {
  if (pairs.length === 0) return [];
  const stdin = pairs.map((p) => JSON.stringify(p)).join('\n') + '\n';
  const argv = ['python3', '-I', '-S', `${MATH_VERIFY_MOUNT}/bin/${SCRIPT}`, `${MATH_VERIFY_MOUNT}/site-packages`];
  const result = await sandbox.exec(argv, {
    stdin,
    timeoutMs: options.timeoutMs ?? MATH_VERIFY_TIMEOUT_MS,
    ...(options.signal && { signal: options.signal }),
  });
  const failure = (why: string): RolloutError => new RolloutError('environment_error', `math-verify checker: ${why}`);
  if (result.timedOut) throw failure(`no verdict within ${options.timeoutMs ?? MATH_VERIFY_TIMEOUT_MS} ms`);
  if (result.exitCode !== 0) throw failure(`exited with ${result.exitCode ?? result.signal}: ${result.stderr.slice(-1000).trim()}`);
  if (result.truncated) throw failure('output over the sandbox output limit');
  const lines = result.stdout.split('\n').filter((line) => line.trim() !== '');
  if (lines.length !== pairs.length) throw failure(`${lines.length} verdicts for ${pairs.length} pairs`);
  return lines.map((line, i) => {
    let parsed: unknown;
    try {
      parsed = JSON.parse(line);
    } catch {
      throw failure(`verdict ${i} is not JSON`);
    }
    const v = parsed as Partial<MathVerifyVerdict> & { error?: unknown };
    if (typeof v.equivalent !== 'boolean' || !Array.isArray(v.gold) || !Array.isArray(v.pred)) {
      throw failure(`pair ${i}: ${typeof v.error === 'string' ? v.error : 'malformed verdict'}`);
    }
    return { equivalent: v.equivalent, gold: v.gold.map(String), pred: v.pred.map(String), ...(typeof v.limit === 'string' && { limit: v.limit }) };
  });
}
