import { posix } from 'node:path';
import { RolloutError } from '../errors.js';
import { MAX_TIMER_MS } from '../timers.js';
import type { ServerConfig } from '../config.js';
import type { SandboxLimits, SandboxMount, SandboxSpec } from './types.js';

/** What an environment may ask of the sandbox of one instance (see Environment.sandbox); the rest is the server's. */
export interface SandboxRequest {
  /** A .sif, a root file system directory, or 'host' for the host's /usr; default the server's configured image. */
  image?: string;
  network?: boolean;
  mounts?: readonly SandboxMount[];
  env?: Readonly<Record<string, string>>;
  /** Tighter or looser limits for this instance (e.g. more memory for a test suite). */
  limits?: Partial<SandboxLimits>;
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * The spec of one sample's sandbox: the server's configured defaults, overridden by what the environment asked
 * for this instance, with the wall clock bounded by the task's total timeout. Throws environment_error naming
 * what is wrong with a request (a relative mount, a bad variable name): that is the plugin's mistake.
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
  if (limits.commandTimeoutMs > MAX_TIMER_MS) throw bad(`limits.commandTimeoutMs must be at most ${MAX_TIMER_MS} (what a timer holds), got ${limits.commandTimeoutMs}`);
  const mounts = (request?.mounts ?? []).map((m) => {
    if (!posix.isAbsolute(m.source) || !posix.isAbsolute(m.target)) throw bad(`mount ${m.source} → ${m.target}: both paths must be absolute`);
    return { source: m.source, target: posix.normalize(m.target), readOnly: m.readOnly ?? true };
  });
  const env = { ...request?.env };
  for (const key of Object.keys(env)) if (!ENV_NAME.test(key)) throw bad(`env: bad variable name ${JSON.stringify(key)}`);
  const image = request?.image === 'host' ? undefined : (request?.image ?? config.image);
  return { image, limits, network: request?.network ?? false, mounts, env, workdir: config.workdir };
}

function bad(why: string): RolloutError {
  return new RolloutError('environment_error', `sandbox request: ${why}`);
}
