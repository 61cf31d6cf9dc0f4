import { afterEach, describe, expect, it } from 'vitest';
import { BashShell } from '../../src/sandboxes/bash-shell.js';
import { MarkerScanner, newNonce } from '../../src/sandboxes/shell-framing.js';
import { formatShellObservation } from '../../src/tools/bash-tool.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../src/sandboxes/types.js';
import { HostProcessSandbox } from '../../src/testing/host-process-sandbox.js';
import { closeAfterAll, testSpec } from './helpers.js';
import { shellTestLimits } from './shell-conformance.js';

// A command may redefine the very shell machinery the frame runs on. Each case used to leave a shell that answered
// every later command with a false observation (and, since nothing timed out, was never restarted). Real bash
// processes, in a bubblewrap sandbox and through the host-process TEST DOUBLE.

const bwrap = closeAfterAll(new BubblewrapDriver());
const makers: Array<[string, () => Promise<Sandbox>]> = [
  ['bubblewrap', () => bwrap.start(testSpec(shellTestLimits))],
  ['host-process test double', () => HostProcessSandbox.create(testSpec(shellTestLimits))],
];

describe.each(makers)('the shell frame against commands that redefine its machinery: %s', (_name, makeSandbox) => {
  let sandbox: Sandbox | undefined;
  afterEach(async () => {
    await sandbox?.stop();
    sandbox = undefined;
  });

  async function freshShell(): Promise<BashShell> {
    sandbox = await makeSandbox();
    return new BashShell(sandbox, { outputLimitBytes: 4096, defaultTimeoutMs: 10_000 });
  }

  it('a function named eval does not swallow later commands', async () => {
    const shell = await freshShell();
    await shell.run('eval() { :; }');
    expect(await shell.run('echo ran')).toMatchObject({ exitCode: 0, output: 'ran\n', restarted: false });
    expect(await shell.run('echo bye; exit 3')).toMatchObject({ exitCode: 3, output: 'bye\n', restarted: true });
  });

  it('a disabled eval is detected: the shell is restarted with a reason and the command runs there', async () => {
    const shell = await freshShell();
    await shell.run('export KEPT=1; enable -n eval');
    const result = await shell.run('echo "ran [$KEPT]"');
    expect(result).toMatchObject({ exitCode: 0, output: 'ran []\n', restarted: true, timedOut: false });
    expect(result.restartReason).toMatch(/unable to run commands/);
    expect(formatShellObservation(result, 10_000)).toMatch(/\[the shell was restarted: its state was lost because an earlier command left it unable to run commands/);
    expect(await shell.run('echo again')).toMatchObject({ exitCode: 0, output: 'again\n', restarted: false });
  });

  it('a shell out of file descriptors (ulimit -n 3) is restarted, not left failing every command', async () => {
    const shell = await freshShell();
    const limited = await shell.run('ulimit -n 3');
    expect(limited).toMatchObject({ exitCode: 0, restarted: true });
    expect(limited.restartReason).toMatch(/unable to run commands/);
    const after = await shell.run('echo hi; ulimit -n');
    expect(after).toMatchObject({ exitCode: 0, restarted: false });
    expect(after.output).toMatch(/^hi\n\d+\n$/);
    expect(after.output).not.toBe('hi\n3\n');
  });

  it('a function named read neither hangs the frame nor leaks its internals into the output', async () => {
    const shell = await freshShell();
    expect(await shell.run('read() { sleep 1000; }', { timeoutMs: 5_000 })).toMatchObject({ exitCode: 0, output: '', timedOut: false, restarted: false });
    expect(await shell.run('echo hi', { timeoutMs: 5_000 })).toMatchObject({ exitCode: 0, output: 'hi\n', timedOut: false, restarted: false });
    expect(await shell.run('echo again', { timeoutMs: 5_000 })).toMatchObject({ exitCode: 0, output: 'again\n', timedOut: false });
  });

  it('a function named printf (which prints the marker) is caught at once, not after a timeout', async () => {
    const shell = await freshShell();
    const defined = await shell.run('printf() { :; }; echo defined', { timeoutMs: 5_000 });
    expect(defined).toMatchObject({ exitCode: 0, output: 'defined\n', timedOut: false, restarted: true });
    expect(defined.restartReason).toMatch(/function named printf/);
    expect(await shell.run('echo hi', { timeoutMs: 5_000 })).toMatchObject({ exitCode: 0, output: 'hi\n', timedOut: false, restarted: false });
  });

  it('an ERR trap does not fire on the frame restoring $?', async () => {
    const shell = await freshShell();
    await shell.run("trap 'echo ERR-TRAP' ERR");
    await shell.run('(exit 4)');
    expect(await shell.run('echo "status $?"')).toMatchObject({ exitCode: 0, output: 'status 4\n' });
  });

  it('xtrace (set -x) shows only the command, and does not fill the shell stderr pipe until it hangs', async () => {
    const shell = await freshShell();
    await shell.run('set -x');
    expect((await shell.run('echo hi')).output).toBe('++ echo hi\nhi\n');
    for (let i = 0; i < 600; i++) {
      const result = await shell.run(':', { timeoutMs: 5_000 });
      if (result.timedOut || result.restarted) throw new Error(`command ${i} after set -x: ${JSON.stringify(result)}`);
    }
  });

  // Guards, not regression tests: the frame now switches POSIX mode on and off around every command.
  it('a readonly POSIXLY_CORRECT (the frame switches POSIX mode with it) is caught at once, not after a timeout', async () => {
    const shell = await freshShell();
    const result = await shell.run('readonly POSIXLY_CORRECT', { timeoutMs: 5_000 });
    expect(result).toMatchObject({ exitCode: 0, timedOut: false, restarted: true });
    expect(result.restartReason).toMatch(/unable to run commands/);
    expect(await shell.run('echo hi', { timeoutMs: 5_000 })).toMatchObject({ exitCode: 0, output: 'hi\n', restarted: false });
  });

  it('POSIX mode the model switched on stays on; the frame switches its own back off', async () => {
    const shell = await freshShell();
    expect((await shell.run('shopt -qo posix; echo $?')).output).toBe('1\n');
    await shell.run('set -o posix');
    expect((await shell.run('shopt -qo posix; echo $?')).output).toBe('0\n');
    await shell.run('set +o posix');
    expect((await shell.run('shopt -qo posix; echo $?')).output).toBe('1\n');
  });
});

describe('MarkerScanner with a canary', () => {
  const marker = (nonce: string, body: string): Buffer => Buffer.from(`out\n${nonce}:${body}:${nonce}\n`);

  it('accepts the expected canary and flags a missing, wrong or annotated one', () => {
    const nonce = newNonce();
    const canary = newNonce();
    const cases: Array<[string, unknown]> = [
      [`0:${canary}:42:/w`, { status: 0, pid: 42, cwd: '/w' }],
      [`3::42:/w`, { status: 3, pid: 42, cwd: '/w', broken: 'not-run' }],
      [`3:${newNonce()}:42:/w`, { status: 3, pid: 42, cwd: '/w', broken: 'tampered' }],
      [`3:${canary}:function:42:/w`, { status: 3, pid: 42, cwd: '/w', broken: 'function' }],
      [`3:${canary}:unusable:42:/w`, { status: 3, pid: 42, cwd: '/w', broken: 'unusable' }],
      [`${canary}:42:/w`, { status: 0, pid: 0, cwd: '', broken: 'tampered' }],
    ];
    for (const [body, expected] of cases) {
      const scanner = new MarkerScanner(nonce, 1024, canary);
      scanner.push(marker(nonce, body));
      expect(scanner.outcome).toEqual({ marker: expected, rest: Buffer.alloc(0) });
      expect(scanner.text()).toBe('out\n');
    }
  });
});
