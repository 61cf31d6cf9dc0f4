import { realpathSync } from 'node:fs';
import { dirname, join, posix, relative, resolve } from 'node:path';
import { RolloutError } from '../errors.js';
import { DEFAULT_IMAGE_CACHE_DIR } from './images/image-recipe.js';
import { MAX_TIMER_MS } from '../timers.js';
import type { ServerConfig } from '../config.js';
import type { SandboxLimits, SandboxMount, SandboxSpec } from './types.js';

/** What an environment may ask of the sandbox of one instance (see Environment.sandbox); the rest is the server's. */
export interface SandboxRequest {
  /**
   * A .sif or a root file system directory inside the server's `sandbox.imageDirs` (see {@link checkRequestedImage});
   * default the server's configured image.
   */
  image?: string;
  network?: boolean;
  mounts?: readonly SandboxMount[];
  env?: Readonly<Record<string, string>>;
  /** Tighter or looser limits for this instance (e.g. more memory for a test suite). */
  limits?: Partial<SandboxLimits>;
  /**
   * Memory the instance needs at least, MiB (e.g. a code task's stated memory limit plus its judge): the sandbox gets
   * this or the server's `memoryMb` (or `limits.memoryMb`), whichever is more. Above the server's
   * {@link maxSandboxMemoryMb} the task is refused (invalid_argument, field `instance`).
   */
  minMemoryMb?: number;
}

/** The default of `sandbox.maxMemoryMb`: what one sandbox may be given when an instance asks for more than `memoryMb`. */
export const DEFAULT_MAX_SANDBOX_MEMORY_MB = 4096;

/**
 * The most memory one sandbox may have, MiB: `sandbox.maxMemoryMb` (default {@link DEFAULT_MAX_SANDBOX_MEMORY_MB}),
 * never less than the server's own `memoryMb`. A bound on what a task can make the server commit per sample: an
 * instance cannot ask for a 64 GiB cgroup on a 24 GiB host.
 */
export function maxSandboxMemoryMb(config: ServerConfig['sandbox']): number {
  return Math.max(config.memoryMb, config.maxMemoryMb ?? DEFAULT_MAX_SANDBOX_MEMORY_MB);
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * The spec of one sample's sandbox: the server's configured defaults, overridden by what the environment asked
 * for this instance, with the wall clock bounded by the task's total timeout. Throws environment_error naming
 * what is wrong with a request (a relative mount, a bad variable name): that is the plugin's mistake. An image outside
 * `sandbox.imageDirs` is invalid_argument, field `instance` (INVALID_TASK): the task named it ({@link checkRequestedImage}).
 */
export function resolveSandboxSpec(config: ServerConfig['sandbox'], request: SandboxRequest | undefined, totalTimeoutMs: number): SandboxSpec {
  const limits: SandboxLimits = {
    memoryMb: config.memoryMb,
    maxProcesses: config.maxProcesses,
    diskMb: config.diskMb,
    wallClockMs: config.wallClockMs,
    commandTimeoutMs: config.commandTimeoutMs,
    outputLimitBytes: config.outputLimitBytes,
    maxFileMb: config.maxFileMb,
    ...request?.limits,
  };
  limits.wallClockMs = Math.min(limits.wallClockMs, totalTimeoutMs);
  for (const [key, value] of Object.entries(limits)) {
    if (!Number.isInteger(value) || value <= 0) throw bad(`limits.${key} must be a positive integer, got ${String(value)}`);
  }
  limits.memoryMb = sandboxMemoryMb(config, request);
  if (limits.commandTimeoutMs > MAX_TIMER_MS) throw bad(`limits.commandTimeoutMs must be at most ${MAX_TIMER_MS} (what a timer holds), got ${limits.commandTimeoutMs}`);
  const mounts = (request?.mounts ?? []).map((m) => {
    if (!posix.isAbsolute(m.source) || !posix.isAbsolute(m.target)) throw bad(`mount ${m.source} → ${m.target}: both paths must be absolute`);
    return { source: m.source, target: posix.normalize(m.target), readOnly: m.readOnly ?? true };
  });
  const env = { ...request?.env };
  for (const key of Object.keys(env)) if (!ENV_NAME.test(key)) throw bad(`env: bad variable name ${JSON.stringify(key)}`);
  const image = request?.image === undefined ? config.image : checkRequestedImage(config, request.image, 'instance');
  return { image, limits, network: request?.network ?? false, mounts, env, workdir: config.workdir };
}

/**
 * The memory of an instance's sandbox, MiB: the request's `limits.memoryMb` (else the server's `memoryMb`), raised to
 * its `minMemoryMb`. Throws environment_error for a `minMemoryMb` that is not a positive integer (the plugin's mistake)
 * and invalid_argument, field `instance` (INVALID_TASK), above {@link maxSandboxMemoryMb}: called at submit too
 * ({@link checkSandboxRequest}), so such a task is refused before any of its samples starts.
 */
export function sandboxMemoryMb(config: ServerConfig['sandbox'], request: SandboxRequest | undefined): number {
  const asked = request?.limits?.memoryMb ?? config.memoryMb;
  const least = request?.minMemoryMb;
  if (least !== undefined && (!Number.isInteger(least) || least <= 0)) throw bad(`minMemoryMb must be a positive integer, got ${String(least)}`);
  const memoryMb = Math.max(asked, least ?? 0);
  const max = maxSandboxMemoryMb(config);
  if (memoryMb > max) {
    throw RolloutError.invalid('instance', `needs a sandbox with ${memoryMb} MiB of memory; this server gives one sandbox at most ${max} MiB (sandbox.maxMemoryMb)`);
  }
  return memoryMb;
}

/**
 * What of a sample's sandbox's wall clock the run stage leaves to the evaluation, ms: the eval stage's timeout, but at
 * most a quarter of the wall clock (a task with a short sandbox life still gets most of it for its tools). The model's
 * tool calls end by the sandbox's deadline less this (see ToolTimeBudget's `endBy`), so a policy that runs its commands
 * into the wall clock ends TRUNCATED and is still evaluated in a live sandbox, instead of every later command and the
 * evaluation failing deadline_exceeded (TIMEOUT).
 */
export function evalReserveMs(wallClockMs: number, evalTimeoutMs: number): number {
  return Math.min(evalTimeoutMs, Math.floor(wallClockMs / 4));
}

/**
 * Where images environments ask for may lie: `sandbox.imageDirs`, by default where `rollout image build` and `rollout
 * swe build` put them and the directory of the configured image. Not all of `.cache`: it also holds engines' logs,
 * whose command lines may carry API keys. Never `/` by default (a configured image at the root would allow anything).
 */
export function allowedImageDirs(config: ServerConfig['sandbox']): string[] {
  if (config.imageDirs) return config.imageDirs;
  const dirs = [DEFAULT_IMAGE_CACHE_DIR, join(dirname(DEFAULT_IMAGE_CACHE_DIR), 'swe', 'images')];
  const own = config.image === undefined ? undefined : dirname(resolve(config.image));
  if (own !== undefined && own !== '/' && !dirs.includes(own)) dirs.push(own);
  return dirs;
}

/**
 * An image an environment asks for one instance (so, often, one a task named) as the sandbox may use it: its real
 * path (symlinks resolved, so what was checked is what starts) when it lies strictly inside one of
 * {@link allowedImageDirs}. Otherwise RolloutError.invalid(`field`, ...) naming the allowed dirs: a task must not run
 * its sandbox over the server's own files ("/", "host", a symlink out of an image dir). The configured image is the
 * operator's choice and passes. A missing path inside the dirs passes unchanged: whoever reports a missing image still
 * does, and there is nothing to read. A path outside them is refused by its name before the file system is asked, with
 * one message whether it exists or not: the answer must not tell whoever named it what lies on the server.
 */
export function checkRequestedImage(config: ServerConfig['sandbox'], image: string, field: string): string {
  if (image === config.image && image !== 'host') return image;
  const dirs = allowedImageDirs(config);
  const refuse = (what: string) => RolloutError.invalid(field, `${what}; images must lie inside ${dirs.join(', ')} (server config sandbox.imageDirs)`);
  if (image === 'host') throw refuse('the image "host" (the server\'s own /usr) is not allowed');
  const outside = () => refuse(`the image ${image} is not inside an allowed directory`);
  if (!dirs.some((dir) => strictlyInside(resolve(image), resolve(dir)) || strictlyInside(resolve(image), realOrAsIs(dir)))) throw outside();
  let real: string;
  try {
    real = realpathSync(image);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return image;
    throw refuse(`the image ${image} cannot be resolved (${code ?? 'unknown error'})`);
  }
  // Named inside, but a symlink (or "..") may lead out: what starts is the real path, so that is checked too.
  if (!dirs.some((dir) => strictlyInside(real, realOrAsIs(dir)))) throw outside();
  return real;
}

function strictlyInside(path: string, dir: string): boolean {
  const rel = relative(dir, path);
  return rel !== '' && rel !== '..' && !rel.startsWith('../') && !posix.isAbsolute(rel);
}

function realOrAsIs(dir: string): string {
  try {
    return realpathSync(dir);
  } catch {
    return resolve(dir);
  }
}

function bad(why: string): RolloutError {
  return new RolloutError('environment_error', `sandbox request: ${why}`);
}
