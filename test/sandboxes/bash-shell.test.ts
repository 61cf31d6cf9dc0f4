import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { RolloutError } from '../../src/errors.js';
import { BashShell } from '../../src/sandboxes/bash-shell.js';
import { MarkerScanner, newNonce } from '../../src/sandboxes/shell-framing.js';
import { HostProcessSandbox } from '../../src/testing/host-process-sandbox.js';
import { testSpec } from './helpers.js';
import { describeShellConformance, shellTestLimits } from './shell-conformance.js';

// Tool logic against the host-process TEST DOUBLE (no isolation); the real drivers run the same suite.
describeShellConformance('host-process test double', () => HostProcessSandbox.create(testSpec(shellTestLimits)));

describe('MarkerScanner', () => {
  it('property: splits output from the marker however the bytes are chunked, and ignores other nonces', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 300 }), fc.array(fc.nat({ max: 400 }), { maxLength: 6 }), fc.string({ maxLength: 20 }), (bytes, cuts, cwd) => {
        const nonce = newNonce();
        const decoy = Buffer.from(`${newNonce()}:0:1:/:`);
        const output = Buffer.concat([decoy, Buffer.from(bytes), Buffer.from(nonce.slice(0, 10))]);
        const cleanCwd = cwd.replaceAll('\0', '');
        const stream = Buffer.concat([output, Buffer.from(`${nonce}:5:42:${cleanCwd}:${nonce}\nafter`)]);
        const scanner = new MarkerScanner(nonce, 1 << 20);
        let at = 0;
        for (const cut of [...cuts].sort((a, b) => a - b)) {
          scanner.push(stream.subarray(at, Math.max(at, Math.min(cut, stream.length))));
          at = Math.max(at, Math.min(cut, stream.length));
        }
        scanner.push(stream.subarray(at));
        expect(scanner.outcome).toEqual({ marker: { status: 5, pid: 42, cwd: cleanCwd }, rest: Buffer.from('after') });
        expect(Buffer.from(scanner.output.text(), 'utf8').equals(Buffer.from(output.toString('utf8'), 'utf8'))).toBe(true);
      }),
    );
  });

  it('keeps counting past the cap and notes how many bytes were dropped', () => {
    const nonce = newNonce();
    const scanner = new MarkerScanner(nonce, 4);
    scanner.push(Buffer.from(`abcdefgh${nonce}:0:1:/w:${nonce}\n`));
    expect(scanner.text()).toBe('abcd\n[output truncated: 4 bytes dropped]');
  });
});

describe('BashShell lifecycle (host-process test double)', () => {
  it('close() kills the shell; later commands fail with sandbox_error', async () => {
    const sandbox = await HostProcessSandbox.create(testSpec(shellTestLimits));
    try {
      const shell = new BashShell(sandbox, { outputLimitBytes: 1024, defaultTimeoutMs: 5_000 });
      expect((await shell.run('echo $$')).exitCode).toBe(0);
      await shell.close();
      await shell.close();
      await expect(shell.run('true')).rejects.toMatchObject({ code: 'sandbox_error' });
    } finally {
      await sandbox.stop();
    }
  });

  it('fails with deadline_exceeded once the wall clock is used up', async () => {
    const sandbox = await HostProcessSandbox.create(testSpec(shellTestLimits));
    try {
      const shell = new BashShell(sandbox, { outputLimitBytes: 1024, defaultTimeoutMs: 5_000, remainingMs: () => 0 });
      const error: unknown = await shell.run('true').catch((err: unknown) => err);
      expect(error).toBeInstanceOf(RolloutError);
      expect((error as RolloutError).code).toBe('deadline_exceeded');
    } finally {
      await sandbox.stop();
    }
  });

  it('reports a shell that cannot start as sandbox_error', async () => {
    const shell = new BashShell(
      () => {
        throw new RolloutError('sandbox_error', 'spawn is not available');
      },
      { outputLimitBytes: 1024, defaultTimeoutMs: 5_000 },
    );
    await expect(shell.run('true')).rejects.toMatchObject({ code: 'sandbox_error' });
  });

  it('runs a trivial command in well under a few milliseconds (median latency printed)', async () => {
    const sandbox = await HostProcessSandbox.create(testSpec(shellTestLimits));
    try {
      const shell = sandbox.shell();
      await shell.run('true');
      const times: number[] = [];
      for (let i = 0; i < 200; i++) times.push((await shell.run('true')).durationMs);
      times.sort((a, b) => a - b);
      const median = times[100]!;
      console.log(`BashShell \`true\` on the host test double: median ${median.toFixed(3)} ms, p90 ${times[180]!.toFixed(3)} ms`);
      expect(median).toBeLessThan(20);
    } finally {
      await sandbox.stop();
    }
  });
});
