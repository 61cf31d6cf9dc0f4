import { describe, expect, it } from 'vitest';
import { BashShell } from '../../src/sandboxes/bash-shell.js';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { closeAfterAll, sandboxesStoppedAfterEach } from './helpers.js';

// Review s40: while the model ran a command, a background job flooding the shell's stdout (`yes &`) was
// read as fast as it wrote, all past the output cap and dropped, looking for the end marker: ~0.3 of a core of the
// server for as long as the command ran. Real bash in a bubblewrap sandbox; the server's CPU is process.cpuUsage.

const driver = closeAfterAll(new BubblewrapDriver());
const startSandbox = sandboxesStoppedAfterEach<BubblewrapSandbox>();

describe('a background flood while a command runs', () => {
  it('costs the server little CPU, and the command still ends with its output, status and marker', async () => {
    const sandbox = await startSandbox(driver, { outputLimitBytes: 16 * 1024, commandTimeoutMs: 20_000, wallClockMs: 120_000 });
    const shell = new BashShell(sandbox, { outputLimitBytes: 16 * 1024, defaultTimeoutMs: 20_000 });
    expect((await shell.run('yes flood & echo started')).exitCode).toBe(0);
    const cpu = process.cpuUsage();
    const wall = performance.now();
    const result = await shell.run('sleep 3; echo done; (exit 4)');
    const elapsed = performance.now() - wall;
    const used = process.cpuUsage(cpu);
    const share = (used.user + used.system) / 1000 / elapsed;
    expect(result).toMatchObject({ exitCode: 4, timedOut: false, restarted: false, truncated: true });
    expect(result.output).toMatch(/^(flood\n)+/);
    expect(elapsed).toBeLessThan(10_000);
    console.log(`server CPU while the command ran: ${(share * 100).toFixed(1)}% of a core over ${Math.round(elapsed)} ms`);
    expect(share).toBeLessThan(0.1);
    // The shell is still usable and the flood still runs (it is the model's job), read only up to the cap.
    const next = await shell.run('echo next');
    expect(next).toMatchObject({ exitCode: 0, restarted: false });
  }, 60_000);
});
