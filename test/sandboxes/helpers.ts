import { readdirSync, readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach } from 'vitest';
import { createBashTool } from '../../src/tools/bash-tool.js';
import { executeToolCalls } from '../../src/tools/execute.js';
import { createPythonTool } from '../../src/tools/python-tool.js';
import type { Sandbox, SandboxDriver, SandboxLimits, SandboxSpec } from '../../src/sandboxes/types.js';

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

/** Polls inside the sandbox until `path` exists (the sandbox's files are not on the host). */
export async function waitForFileInSandbox(sandbox: Sandbox, path: string, timeoutMs = 15_000): Promise<void> {
  await waitFor(async () => (await sandbox.exec(['test', '-e', path])).exitCode === 0, timeoutMs, `${path} to appear in ${sandbox.id}`);
}

/** Cgroup directories (below the hierarchy roots) whose path contains `needle`, in the memory and pids hierarchies. */
export function cgroupsMatching(needle: string): string[] {
  const found: string[] = [];
  const walk = (dir: string): void => {
    let entries;
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      if (!e.isDirectory()) continue;
      const path = `${dir}/${e.name}`;
      if (path.includes(needle)) found.push(path);
      walk(path);
    }
  };
  for (const controller of ['memory', 'pids']) walk(`/sys/fs/cgroup/${controller}/rollout-sandboxes`);
  return found;
}

/** Every process in this server's sandbox cgroups (v1), by host pid. */
export function processesInOurCgroups(): number[] {
  const pids = new Set<number>();
  for (const dir of cgroupsMatching(`/${process.pid}-`)) {
    try {
      for (const line of readFileSync(`${dir}/cgroup.procs`, 'utf8').split('\n')) if (line) pids.add(Number(line));
    } catch {
      // Removed meanwhile.
    }
  }
  return [...pids];
}

/** Lines of this process's mount table that mention `needle`. */
export function mountsMatching(needle: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.includes(needle));
}

/**
 * Registers `afterAll(() => driver.close?.())` where it is called (a file's top level or a describe) and returns the
 * driver. A driver keeps images mounted for a grace period after its sandboxes stop; a test file whose worker exits
 * meanwhile would leave the mount behind (test/support/leftovers.global.ts fails the run when one is left).
 */
export function closeAfterAll<T extends SandboxDriver>(driver: T): T {
  afterAll(() => driver.close?.());
  return driver;
}

/**
 * Starts sandboxes of `driver` (host layout, testSpec limits) and stops every one after each test (registers
 * `afterEach` where it is called).
 */
export function sandboxesStoppedAfterEach<S extends Sandbox>(): (driver: { start(spec: SandboxSpec): Promise<S> }, overrides?: Partial<SandboxLimits>) => Promise<S> {
  const started: Sandbox[] = [];
  afterEach(async () => {
    await Promise.all(started.splice(0).map((s) => s.stop()));
  });
  return async (driver, overrides = {}) => {
    const sandbox = await driver.start(testSpec(overrides));
    started.push(sandbox);
    return sandbox;
  };
}

/** One tool call through the bash and python tools (5 s timeouts), as the agent loop makes it. */
export function callTool(name: string, args: Record<string, unknown>, sandbox: Sandbox): ReturnType<typeof executeToolCalls> {
  return executeToolCalls({ calls: [{ name, arguments: args }], errors: [] }, SHELL_TOOLS, { sandbox, signal: new AbortController().signal });
}
const SHELL_TOOLS = [createBashTool({ timeoutMs: 5_000 }), createPythonTool({ timeoutMs: 5_000 })];
