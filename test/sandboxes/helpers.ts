import { readdirSync, readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import type { SandboxLimits, SandboxSpec } from '../../src/sandboxes/types.js';

/** A host-layout sandbox spec with limits small enough for CI, large enough for a Python interpreter. */
export function testSpec(overrides: Partial<SandboxLimits> & { network?: boolean; image?: string } = {}): SandboxSpec {
  const { network, image, ...limits } = overrides;
  return {
    image,
    network: network ?? false,
    mounts: [],
    env: {},
    workdir: '/work',
    limits: { memoryMb: 512, maxProcesses: 64, diskMb: 256, wallClockMs: 30_000, commandTimeoutMs: 30_000, outputLimitBytes: 64 * 1024, maxFileMb: 256, ...limits },
  };
}

/** A host process identified by PID plus its start time (so a reused PID is not mistaken for it). */
export interface HostProcess {
  pid: number;
  startTime: string;
}

function statFields(pid: number): string[] | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the parenthesised command name: state is field 3, starttime field 22.
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  } catch {
    return undefined;
  }
}

/**
 * Host PIDs of the processes whose environment carries `TOKEN=<token>`. The sandbox cannot tell us its host
 * PIDs (it has its own PID namespace), so tests tag a run with a unique environment variable and look the
 * processes up by that tag once; from then on they are checked by PID.
 */
export function findHostProcessesWithEnv(name: string, token: string): HostProcess[] {
  const needle = `${name}=${token}`;
  const found: HostProcess[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    let environ: string;
    try {
      environ = readFileSync(`/proc/${pid}/environ`, 'utf8');
    } catch {
      continue;
    }
    if (!environ.split('\0').includes(needle)) continue;
    const fields = statFields(pid);
    if (fields) found.push({ pid, startTime: fields[19] ?? '' });
  }
  return found;
}

/** True while that very process exists and is not a zombie. */
export function isAlive(proc: HostProcess): boolean {
  const fields = statFields(proc.pid);
  return fields !== undefined && fields[19] === proc.startTime && fields[0] !== 'Z';
}

export async function waitFor(condition: () => boolean | Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}
