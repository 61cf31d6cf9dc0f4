import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { RolloutError } from '../../src/errors.js';
import type { Sandbox } from '../../src/sandboxes/types.js';

/**
 * The persistent-shell conformance suite, parameterised by how to make a sandbox, so every driver runs the same
 * checks: `describeShellConformance('bubblewrap', () => driver.start(testSpec({ ... })))`. The sandbox must have
 * an output limit of 4096 bytes and a command timeout of at least 5 s (see `shellTestLimits`).
 */
export const shellTestLimits = { outputLimitBytes: 4096, commandTimeoutMs: 10_000, wallClockMs: 120_000 } as const;

export function describeShellConformance(name: string, makeSandbox: () => Promise<Sandbox>): void {
  describe(`persistent shell conformance: ${name}`, () => {
    let sandbox: Sandbox;

    beforeAll(async () => {
      sandbox = await makeSandbox();
    });

    afterAll(async () => {
      await sandbox?.stop();
    });

    const run = (command: string, timeoutMs?: number) => sandbox.shell().run(command, timeoutMs === undefined ? {} : { timeoutMs });

    it('carries the exit status, cwd, exported and plain variables from one command to the next', async () => {
      const first = await run('mkdir -p sub && cd sub && export EXPORTED=1 && PLAIN=2 && false');
      expect(first).toMatchObject({ exitCode: 1, output: '', timedOut: false, restarted: false });
      expect(first.cwd).toMatch(/\/sub$/);
      const second = await run('echo "$? $EXPORTED $PLAIN"; pwd; sh -c \'echo child sees $EXPORTED\'');
      expect(second.exitCode).toBe(0);
      expect(second.output).toBe(`1 1 2\n${first.cwd}\nchild sees 1\n`);
      await run('cd ..');
    });

    it('interleaves stdout and stderr in the order they were written, byte-exact, without a final newline', async () => {
      expect((await run('echo out1; echo err1 >&2; echo out2; printf tail >&2')).output).toBe('out1\nerr1\nout2\ntail');
    });

    it('treats output that looks like the framing or an end marker as plain output', async () => {
      const fake = 'r0123456789abcdef0123456789abcdef:0:1:/:r0123456789abcdef0123456789abcdef';
      const result = await run(`echo '${fake}'; echo "__rollout_n"; exit_code_is=7; echo done`);
      expect(result).toMatchObject({ exitCode: 0, output: `${fake}\n__rollout_n\ndone\n`, restarted: false });
    });

    it('property: any printed text comes back exactly and never ends a command early', async () => {
      await fc.assert(
        fc.asyncProperty(fc.string({ unit: fc.constantFrom('a', ':', '0', '7', 'r', 'f', '\n', '\\', "'", '"', '$', ' ', 'é') }), async (text) => {
          const result = await run(`printf '%s' ${`'${text.replaceAll("'", `'\\''`)}'`}; echo; echo END`);
          expect(result.output).toBe(`${text}\nEND\n`);
          expect(result.exitCode).toBe(0);
        }),
        { numRuns: 40 },
      );
    });

    it('gives commands /dev/null as stdin, so they cannot read the control channel', async () => {
      const result = await run('cat; read -r line; echo "read: $? [$line]"', 5_000);
      expect(result).toMatchObject({ exitCode: 0, output: 'read: 1 []\n', timedOut: false });
    });

    it('decodes binary and invalid UTF-8 output with replacement characters', async () => {
      const result = await run("printf 'a\\377\\376b\\n'");
      expect(result.output).toBe('a\uFFFD\uFFFDb\n');
    });

    it('caps endless output with a visible note and still times the command out', async () => {
      const result = await run('yes', 500);
      expect(result).toMatchObject({ exitCode: null, timedOut: true, truncated: true, restarted: false });
      expect(result.output).toMatch(/^(y\n){2048}\[output truncated: \d+ bytes dropped\]$/);
    });

    it('interrupts a timed-out command and keeps the shell with its variables', async () => {
      await run('export KEEP=kept');
      const result = await run('echo started; sleep 30; echo not reached', 500);
      expect(result).toMatchObject({ exitCode: null, timedOut: true, restarted: false });
      expect(result.output).toMatch(/^started\n/);
      expect(result.output).not.toMatch(/not reached/);
      expect((await run('echo "$? $KEEP"')).output).toBe('137 kept\n');
    });

    it('interrupts a busy loop of builtins and nested loops', async () => {
      expect(await run('while :; do :; done; echo no', 300)).toMatchObject({ timedOut: true, restarted: false, output: '' });
      const nested = await run('for i in 1 2; do while :; do sleep 1; done; done; echo no', 300);
      expect(nested).toMatchObject({ timedOut: true, restarted: false });
      expect(nested.output).not.toMatch(/no\n/);
    });

    it('restarts a shell that will not give control back, in the same cwd, and says so', async () => {
      await run('mkdir -p stubborn && cd stubborn && export GONE=1');
      const result = await run("trap '' USR1; sleep 1000 & wait; while :; do sleep 1; done", 300);
      expect(result).toMatchObject({ exitCode: null, timedOut: true, restarted: true });
      const after = await run('echo "[$GONE]"; pwd');
      expect(after).toMatchObject({ exitCode: 0, restarted: false, output: `[]\n${result.cwd}\n` });
      expect(result.cwd).toMatch(/\/stubborn$/);
      await run('cd ..');
    });

    it('restarts after a command exits the shell, reports its exit code, and keeps the cwd', async () => {
      await run('mkdir -p leaving && cd leaving');
      const result = await run('echo bye; exit 3');
      expect(result).toMatchObject({ exitCode: 3, output: 'bye\n', restarted: true, timedOut: false });
      expect(result.cwd).toMatch(/\/leaving$/);
      expect(await run('echo $?')).toMatchObject({ output: '3\n', restarted: false });
      await run('cd ..');
    });

    it('runs concurrent calls one at a time, in call order', async () => {
      const shell = sandbox.shell();
      const results = await Promise.all([shell.run('X=1; sleep 0.2; echo a'), shell.run('echo "b $X"; X=2'), shell.run('echo "c $X"')]);
      expect(results.map((r) => r.output)).toEqual(['a\n', 'b 1\n', 'c 2\n']);
    });

    it('throws cancelled on abort, and the next command runs in a restarted shell', async () => {
      const controller = new AbortController();
      const pending = sandbox.shell().run('sleep 30', { signal: controller.signal });
      setTimeout(() => controller.abort(), 200);
      const error: unknown = await pending.catch((err: unknown) => err);
      expect(error).toBeInstanceOf(RolloutError);
      expect((error as RolloutError).code).toBe('cancelled');
      expect(await run('echo again')).toMatchObject({ output: 'again\n', restarted: true });
    });
  });
}
