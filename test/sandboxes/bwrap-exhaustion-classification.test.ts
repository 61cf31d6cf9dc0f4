import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { tmpfsSizeMb } from '../../src/sandboxes/bwrap-command.js';
import { exhaustedLimit, isSandboxLimitError } from '../../src/sandboxes/limit-errors.js';
import type { SandboxLimits } from '../../src/sandboxes/types.js';
import { callTool, closeAfterAll, sandboxesStoppedAfterEach, testSpec, waitFor } from './helpers.js';

const driver = closeAfterAll(new BubblewrapDriver());
const startSandbox = sandboxesStoppedAfterEach<BubblewrapSandbox>();
const start = (overrides: Partial<SandboxLimits> = {}): Promise<BubblewrapSandbox> => startSandbox(driver, overrides);
const call = callTool;
const MiB = 1024 * 1024;
const limits = testSpec({ memoryMb: 128, maxProcesses: 16 }).limits;

// Regression (review: exhaustion-classification): what the model did inside its own sandbox is its outcome (an
// error observation it sees), never SANDBOX_ERROR; a sandbox broken by anything else still is.
describe('a sandbox the model exhausted is the model\'s outcome, not SANDBOX_ERROR', () => {
  it('process limit used up by a daemon: the next python call is an error observation naming the limit', async () => {
    const sandbox = await start({ maxProcesses: 16 });
    const bomb = "setsid sh -c 'while :; do sleep 1000 & done' </dev/null >/dev/null 2>&1 & echo started";
    expect((await call('bash', { command: bomb }, sandbox))[0]!.output).toContain('started');
    await sleep(1_000);
    const [python] = await call('python', { code: 'print(1)' }, sandbox);
    expect(python).toMatchObject({ toolName: 'python', outcome: 'error' });
    expect(python!.output).toContain('the sandbox is out of processes (pids.max 16)');
    // The persistent shell still answers (builtins need no new process).
    expect((await call('bash', { command: 'echo still here' }, sandbox))[0]!.output).toContain('still here');
  }, 60_000);

  it('tmpfs files cannot fill the memory limit: the sandbox survives and the next call is not an infrastructure failure', async () => {
    const sandbox = await start({ memoryMb: 128, diskMb: 100 });
    const fill = 'head -c 95M /dev/zero > /tmp/a; head -c 95M /dev/zero > /work/b; echo done';
    const [first] = await call('bash', { command: fill }, sandbox);
    expect(first!.output).toContain('No space left on device');
    const [python] = await call('python', { code: 'print(1)' }, sandbox);
    expect(python!.toolName).toBe('python'); // resolved (the cell cannot be written to the full workspace: 'error')
    await call('bash', { command: 'rm -f /work/b' }, sandbox);
    expect(await call('python', { code: 'print(2)' }, sandbox)).toMatchObject([{ outcome: 'ok', output: '2' }]);
    expect(await sandbox.peakMemoryBytes()).toBeLessThanOrEqual(128 * MiB);
  }, 60_000);

  it('a sandbox that died of something else (its init killed from outside) stays sandbox_error', async () => {
    const sandbox = await start();
    const initPid = (sandbox as unknown as { init: { holder: { initPid: number } } }).init.holder.initPid;
    process.kill(initPid, 'SIGKILL');
    const holder = (sandbox as unknown as { init: { holder: { alive: boolean } } }).init.holder;
    await waitFor(() => !holder.alive, 5_000, 'the holder to exit');
    await expect(call('python', { code: 'print(1)' }, sandbox)).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringContaining('died') });
    await expect(call('bash', { command: 'true' }, sandbox)).rejects.toMatchObject({ code: 'sandbox_error' });
  }, 60_000);

  it('commands are first in line for the OOM killer (oom_score_adj 1000); capabilities report the holder protection', async () => {
    const sandbox = await start();
    const r = await sandbox.exec(['cat', '/proc/self/oom_score_adj']);
    expect(r.stdout.trim()).toBe('1000');
    expect(typeof driver.capabilities.oomProtection).toBe('boolean');
  });
});

describe('exhaustedLimit (the classification rule)', () => {
  const launch = { kind: 'launch' as const, signal: null, detail: 'nsenter: fork failed: Resource temporarily unavailable' };
  it('a launch failing at pids.max is the processes limit; with room left it is no limit (infrastructure)', () => {
    const atLimit = exhaustedLimit({ pids: { current: 19, max: 19 } }, launch, limits);
    expect(isSandboxLimitError(atLimit)).toBe(true);
    expect(atLimit).toMatchObject({ code: 'sandbox_error', limit: 'processes', fatal: false });
    expect(atLimit!.message).toContain('pids.max 16');
    expect(exhaustedLimit({ pids: { current: 5, max: 19 }, memory: { usageBytes: 10 * MiB, limitBytes: 128 * MiB, failures: 0, oomKills: 0 } }, launch, limits)).toBeUndefined();
    expect(exhaustedLimit(undefined, launch, limits)).toBeUndefined();
  });

  it('memory: at the limit, or the launcher OOM-killed; a holder that died with OOM kills died of the limit', () => {
    const full = { usageBytes: 127 * MiB, limitBytes: 128 * MiB, failures: 3, oomKills: 0 };
    expect(exhaustedLimit({ memory: full }, launch, limits)).toMatchObject({ limit: 'memory', fatal: false });
    const killed = { usageBytes: 20 * MiB, limitBytes: 128 * MiB, failures: 3, oomKills: 1 };
    expect(exhaustedLimit({ memory: killed }, { ...launch, signal: 'SIGKILL' }, limits)).toMatchObject({ limit: 'memory' });
    expect(exhaustedLimit({ memory: killed }, launch, limits)).toBeUndefined();
    expect(exhaustedLimit({ memory: killed }, { kind: 'died' }, limits)).toMatchObject({ limit: 'memory', fatal: true, message: expect.stringContaining('ran out of memory') });
    expect(exhaustedLimit({ memory: { ...killed, oomKills: 0 } }, { kind: 'died' }, limits)).toBeUndefined();
  });

  it('keeps the two tmpfs below the memory limit (2 × size + reserve ≤ memoryMb)', () => {
    expect(tmpfsSizeMb({ memoryMb: 1024, diskMb: 512 })).toBe(384);
    expect(tmpfsSizeMb({ memoryMb: 1024, diskMb: 256 })).toBe(256);
    expect(tmpfsSizeMb({ memoryMb: 128, diskMb: 100 })).toBe(32);
    for (const memoryMb of [16, 64, 128, 512, 4096]) expect(2 * tmpfsSizeMb({ memoryMb, diskMb: 1 << 20 })).toBeLessThan(memoryMb);
  });
});

