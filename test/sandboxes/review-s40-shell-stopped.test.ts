import { describe, expect, it } from 'vitest';
import { BashShell } from '../../src/sandboxes/bash-shell.js';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { formatShellObservation } from '../../src/tools/bash-tool.js';
import { closeAfterAll, sandboxesStoppedAfterEach } from './helpers.js';
import { shellTestLimits } from './shell-conformance.js';

// Review s40: states a command can leave the persistent shell in, each of which made every frame after it fail. They
// used to end in the command's whole timeout and a restart without a reason (set -n, exec >file, a skipping DEBUG
// trap), in a false exit code 2 (an alias of a reserved word), or in the frame's own commands in the output (a DEBUG
// trap, BASH_XTRACEFD=1). Real bash in bubblewrap sandboxes.

const driver = closeAfterAll(new BubblewrapDriver());
const startSandbox = sandboxesStoppedAfterEach<BubblewrapSandbox>();

/** Generous next to a test's time, far under the 10 s command timeout these shells use. */
const QUICK_MS = 5_000;

async function freshShell(): Promise<BashShell> {
  const sandbox = await startSandbox(driver, shellTestLimits);
  return new BashShell(sandbox, { outputLimitBytes: 4096, defaultTimeoutMs: 10_000 });
}

describe('a command that stops the shell from running commands', () => {
  it.each([
    ['set -n', 'cd /tmp; set -n; echo not run'],
    ['set -o noexec', 'set -o noexec'],
    ['a DEBUG trap under extdebug that skips every command', "shopt -s extdebug; trap 'false' DEBUG"],
  ])('%s: the shell is restarted at once and the model told why', async (_name, command) => {
    const shell = await freshShell();
    await shell.run('export KEPT=1');
    const started = performance.now();
    const result = await shell.run(command);
    expect(performance.now() - started).toBeLessThan(QUICK_MS);
    expect(result).toMatchObject({ exitCode: null, timedOut: false, restarted: true, output: '' });
    expect(result.restartReason).toMatch(/stop running commands \(set -n, or a DEBUG trap under shopt -s extdebug/);
    expect(formatShellObservation(result, 10_000)).toMatch(/^\[exit code unknown\]\n\[the shell was restarted: its state was lost because this command made the shell stop/);
    expect(await shell.run('echo "ran [$KEPT]"')).toMatchObject({ exitCode: 0, output: 'ran []\n', restarted: false });
  }, 60_000);

  it('a function named shopt (which the frame uses around every command) is caught at once, not after a timeout', async () => {
    const shell = await freshShell();
    const started = performance.now();
    const result = await shell.run('shopt() { sleep 1000; }; echo defined');
    expect(performance.now() - started).toBeLessThan(QUICK_MS);
    expect(result).toMatchObject({ exitCode: 0, output: 'defined\n', timedOut: false, restarted: true });
    expect(result.restartReason).toMatch(/function named printf, builtin or shopt/);
    expect(await shell.run('echo hi')).toMatchObject({ exitCode: 0, output: 'hi\n', restarted: false });
  }, 60_000);

  // A guard for this change's own reliance on read (the frame did not use it before).
  it('a disabled read (which takes the frame\'s sentinel line off stdin) is caught at once', async () => {
    const shell = await freshShell();
    const result = await shell.run('enable -n read; echo disabled');
    expect(result).toMatchObject({ exitCode: 0, output: 'disabled\n', timedOut: false, restarted: true });
    expect(result.restartReason).toMatch(/unable to run commands/);
    expect(await shell.run('echo hi')).toMatchObject({ exitCode: 0, output: 'hi\n', restarted: false });
  }, 60_000);

  it('a plain exit 2 is still the exit code 2 of a restarted shell, without that reason', async () => {
    const shell = await freshShell();
    const result = await shell.run('echo bye; exit 2');
    expect(result).toMatchObject({ exitCode: 2, output: 'bye\n', restarted: true });
    expect(result.restartReason).toBeUndefined();
  }, 60_000);
});

describe("a command that redirects the shell's own descriptors with exec", () => {
  it('exec >file sends the rest of that command to the file; the next command prints normally', async () => {
    const shell = await freshShell();
    const started = performance.now();
    const result = await shell.run('echo before; exec >/tmp/out 2>&1; echo into-file; echo err-into-file >&2');
    expect(performance.now() - started).toBeLessThan(QUICK_MS);
    expect(result).toMatchObject({ exitCode: 0, output: 'before\n', timedOut: false, restarted: false });
    expect(await shell.run('echo next; echo next-err >&2; cat /tmp/out')).toMatchObject({
      exitCode: 0,
      output: 'next\nnext-err\ninto-file\nerr-into-file\n',
      restarted: false,
    });
  }, 60_000);

  // A guard: this passed before too (the eval's `</dev/null` was undone already).
  it('exec <file does not make the shell read its commands from the file', async () => {
    const shell = await freshShell();
    await shell.run("printf 'echo from-the-file\\n' >/tmp/cmds");
    expect(await shell.run('exec </tmp/cmds; echo in')).toMatchObject({ exitCode: 0, output: 'in\n', restarted: false });
    expect(await shell.run('echo next')).toMatchObject({ exitCode: 0, output: 'next\n', restarted: false });
  }, 60_000);

  // A guard: the frame's redirections leave the command's children 0, 1 and 2 only (ls's own directory is 3).
  it('the descriptors the frame keeps its streams on are not inherited by the command', async () => {
    const shell = await freshShell();
    const result = await shell.run('ls /proc/self/fd | sort -n | tr "\\n" " "');
    expect(result.output).toBe('0 1 2 3 ');
  }, 60_000);
});

describe('aliases of reserved words', () => {
  it('do not break the frame (no false exit code 2, no restart), and the model can still use aliases', async () => {
    const shell = await freshShell();
    const define = "shopt -s expand_aliases; alias for='echo F' '{'='echo B' case='echo C' '[['='echo D' ll='echo LL'";
    expect(await shell.run(define)).toMatchObject({ exitCode: 0, output: '', restarted: false });
    expect(await shell.run('echo hi; (exit 5)')).toMatchObject({ exitCode: 5, output: 'hi\n', restarted: false });
    expect(await shell.run('shopt -s expand_aliases\nll')).toMatchObject({ exitCode: 0, output: 'LL\n', restarted: false });
    expect(await shell.run('echo "status $?"')).toMatchObject({ exitCode: 0, output: 'status 0\n', restarted: false });
  }, 60_000);

  // A guard, not a regression test: this passed before too (in POSIX mode bash does not alias reserved words).
  it('in POSIX mode (where bash always expands aliases) either', async () => {
    const shell = await freshShell();
    const define = "set -o posix; alias for='echo F' '{'='echo B' case='echo C' '[['='echo D' ll='echo LL'";
    expect(await shell.run(define)).toMatchObject({ exitCode: 0, restarted: false });
    expect(await shell.run('echo hi')).toMatchObject({ exitCode: 0, output: 'hi\n', restarted: false });
    expect(await shell.run('ll')).toMatchObject({ exitCode: 0, output: 'LL\n', restarted: false });
    expect(await shell.run('shopt -qo posix; echo $?')).toMatchObject({ exitCode: 0, output: '0\n', restarted: false });
  }, 60_000);
});

describe("the frame's own commands are not in the output", () => {
  it('under a DEBUG trap that prints every command', async () => {
    const shell = await freshShell();
    expect(await shell.run('trap \'echo "dbg: $BASH_COMMAND"\' DEBUG')).toMatchObject({ exitCode: 0, output: '' });
    expect(await shell.run('echo hi')).toMatchObject({ exitCode: 0, output: 'dbg: echo hi\nhi\n', restarted: false });
    expect(await shell.run('false')).toMatchObject({ exitCode: 1, output: 'dbg: false\n', restarted: false });
  }, 60_000);

  it('under xtrace to stdout (BASH_XTRACEFD=1)', async () => {
    const shell = await freshShell();
    expect(await shell.run('BASH_XTRACEFD=1; set -x')).toMatchObject({ exitCode: 0, output: '' });
    expect(await shell.run('echo hi')).toMatchObject({ exitCode: 0, output: '++ echo hi\nhi\n', restarted: false });
  }, 60_000);
});
