import { afterAll, describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { ApptainerDriver } from '../../src/sandboxes/apptainer.js';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { MarkerScanner, newNonce } from '../../src/sandboxes/shell-framing.js';
import type { PersistentShell, Sandbox, ShellResult } from '../../src/sandboxes/types.js';
import { formatShellObservation } from '../../src/tools/bash-tool.js';
import { makeApptainerDouble } from './apptainer-double.js';
import { closeAfterAll, sandboxesStoppedAfterEach, waitFor, waitForFileInSandbox } from './helpers.js';
import { shellTestLimits } from './shell-conformance.js';

// Review s41: a persistent shell that ended BETWEEN commands (a background job of the model's killed it after its
// command returned: `(sleep 0.3; kill -9 $$) &`) stayed the sandbox's shell. The next command was written to the dead
// shell and came back as a failure ([killed], empty output) without having run, and nothing told the model its state
// was gone. Now the command runs in a new shell and its result says, once, that the old one had ended and how.
// Real bash in bubblewrap sandboxes, and the apptainer driver over its bwrap-backed TEST DOUBLE (apptainer is not
// installed here); both hand out the same BashShell.

const double = makeApptainerDouble();
afterAll(() => double.cleanup());
const bwrap = closeAfterAll(new BubblewrapDriver());
const drivers = [
  ['bubblewrap', bwrap, {}],
  ['apptainer driver over the apptainer test double', closeAfterAll(new ApptainerDriver({ binary: double.binary, tmpRoot: double.tmpRoot })), { image: '/' }],
] as const;
const startSandbox = sandboxesStoppedAfterEach<Sandbox>();
const startBwrap = sandboxesStoppedAfterEach<BubblewrapSandbox>();

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Waits until the shell whose pid (in the sandbox) a command saved in .shellpid (in the workdir) has ended: its /proc
 * entry gone, a zombie, or no longer a bash, as an exec into the sandbox sees it. A fixed sleep after the job's
 * `sleep 0.3` was a race on a loaded box (the next command could reach the shell before the job killed it). Where an
 * exec does not see the shell's processes (the apptainer double runs execs in a PID namespace of their own) it falls
 * back to that sleep.
 */
async function shellEnded(sandbox: Sandbox): Promise<void> {
  const pid = (await sandbox.readFile(`${sandbox.workdir}/.shellpid`)).trim();
  const alive = async (): Promise<boolean> => {
    const stat = await sandbox.exec(['cat', `/proc/${pid}/stat`]);
    return stat.exitCode === 0 && /^\d+ \(bash\) [^Z]/.test(stat.stdout);
  };
  if (!(await alive())) return sleep(1000);
  await waitFor(async () => !(await alive()), 30_000, `the shell (pid ${pid} in the sandbox) to end`);
}

describe.each(drivers)('%s: a shell that ended between commands', (_name, driver, image) => {
  const start = (): Promise<Sandbox> => startSandbox({ start: (spec) => driver.start({ ...spec, ...image }) }, shellTestLimits);

  it('killed by a background job after its command returned: the next command runs in a new shell and says so once', async () => {
    const sandbox = await start();
    const shell = sandbox.shell();
    expect(await shell.run('echo $$ > .shellpid; cd /tmp; export KEPT=1; f() { :; }; (sleep 0.3; echo "job output"; kill -9 $$) &')).toMatchObject({ exitCode: 0, restarted: false, cwd: '/tmp' });
    await shellEnded(sandbox);
    const next = await shell.run('pwd; echo "[$KEPT]"; type -t f || echo no f');
    expect(next).toMatchObject({ exitCode: 0, timedOut: false, restarted: true, cwd: '/tmp', output: 'job output\n/tmp\n[]\nno f\n' });
    expect(next.restartReason).toMatch(/the shell ended between the previous command and this one \(it was killed by (SIGKILL|signal 9)/);
    expect(formatShellObservation(next, 10_000)).toMatch(
      /^job output\n\/tmp\n\[\]\nno f\n\[the shell was restarted: its state was lost because the shell ended between the previous command and this one \(it was killed by [^)]*\), so this command ran in a new shell; variables, functions and background jobs are gone; working directory is \/tmp\]$/,
    );
    // Told once: the command after it runs in the same (new) shell.
    expect(await shell.run('export B=2; echo "$B"')).toMatchObject({ exitCode: 0, output: '2\n', restarted: false });
    expect(await shell.run('echo "$B"')).toMatchObject({ exitCode: 0, output: '2\n', restarted: false });
  });

  it('ended with an exit status between commands (a trap the job fired): the status is named', async () => {
    const sandbox = await start();
    const shell = sandbox.shell();
    expect(await shell.run("trap 'exit 5' USR2; (sleep 0.3; kill -USR2 $$; touch .signalled) &")).toMatchObject({ exitCode: 0, restarted: false });
    await waitForFileInSandbox(sandbox, `${sandbox.workdir}/.signalled`, 30_000);
    // Bash runs the trap only when the next command arrives, and ends before it began that command: the command runs
    // once, in the new shell (its side effect is there once), and the job's output before it is kept.
    const next = await shell.run('echo hi; echo x >> ran-once');
    expect(next).toMatchObject({ exitCode: 0, output: 'hi\n', restarted: true });
    expect(next.restartReason).toMatch(/this one \(exit code 5;/);
    expect(await shell.run('cat ran-once')).toMatchObject({ exitCode: 0, output: 'x\n', restarted: false });
  });

  it('ended by SIGTERM between commands: the signal is named', async () => {
    const sandbox = await start();
    const shell = sandbox.shell();
    expect(await shell.run('echo $$ > .shellpid; (sleep 0.3; kill -TERM $$) &')).toMatchObject({ exitCode: 0, restarted: false });
    await shellEnded(sandbox);
    const next = await shell.run('echo hi');
    expect(next).toMatchObject({ exitCode: 0, output: 'hi\n', restarted: true });
    expect(next.restartReason).toMatch(/\(it was killed by (SIGTERM|signal 15);/);
  });

  it('`exit 3` is reported by its own command; the next command prints hi with exit 0 and no second notice', async () => {
    const sandbox = await start();
    const shell = sandbox.shell();
    const exited = await shell.run('cd /tmp; exit 3');
    expect(exited).toMatchObject({ exitCode: 3, restarted: true, timedOut: false });
    expect(formatShellObservation(exited, 10_000)).toMatch(/^\[exit code 3\]\n\[the shell was restarted: variables, functions and background jobs are gone/);
    await sleep(300);
    expect(await shell.run('echo hi')).toMatchObject({ exitCode: 0, output: 'hi\n', restarted: false });
    expect(await shell.run('exec true')).toMatchObject({ exitCode: 0, restarted: true });
    // A command that ends the shell itself ran: it is never run a second time.
    expect(await shell.run('echo x >> once; exit 4')).toMatchObject({ exitCode: 4, restarted: true });
    expect(await shell.run('cat once')).toMatchObject({ exitCode: 0, output: 'x\n', restarted: false });
    await sleep(300);
    expect(await shell.run('echo hi')).toMatchObject({ exitCode: 0, output: 'hi\n', restarted: false });
  });

  it('commands sent while the shell is dying are never reported as run by a dead shell, and nothing is thrown unhandled', async () => {
    const sandbox = await start();
    const shell = sandbox.shell();
    await shell.run('(sleep 0.2; kill -9 $$) &');
    const results: ShellResult[] = [];
    // Until the kill has come (bounded: a loaded box may take far longer than the job's 0.2 s), and a few commands after.
    const until = performance.now() + 30_000;
    while (performance.now() < until && !results.some((r) => r.restarted)) results.push(await shell.run('echo ran'));
    for (let i = 0; i < 3; i++) results.push(await shell.run('echo ran'));
    for (const r of results) {
      // Either it ran (in the old shell or a new one), or the kill came while it ran: then it says it was killed.
      if (r.exitCode === 0) expect(r.output).toBe('ran\n');
      else expect(r).toMatchObject({ exitCode: null, restarted: true });
    }
    expect(results.filter((r) => r.restarted)).toHaveLength(1);
    expect(await shell.run('echo after')).toMatchObject({ exitCode: 0, output: 'after\n', restarted: false });
  });

  it('a stopped sandbox: its shell still fails as the sandbox error, not as an exit code', async () => {
    const sandbox = await start();
    const shell: PersistentShell = sandbox.shell();
    await shell.run('(sleep 0.2; kill -9 $$) &');
    await sleep(600);
    await sandbox.stop();
    await expect(shell.run('echo hi')).rejects.toMatchObject({ code: 'sandbox_error' });
  });
});

describe('MarkerScanner ack line', () => {
  it('property: the ack line is taken out of the output however the bytes are chunked; without it nothing is held back for good', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 200 }), fc.uint8Array({ maxLength: 200 }), fc.array(fc.nat({ max: 600 }), { maxLength: 6 }), fc.boolean(), (before, after, cuts, withAck) => {
        const nonce = newNonce();
        const ack = newNonce();
        const stream = Buffer.concat([Buffer.from(before), withAck ? Buffer.from(`${ack}\n`) : Buffer.alloc(0), Buffer.from(after), Buffer.from(`${nonce}:0:c:7:/w:${nonce}\n`)]);
        const scanner = new MarkerScanner(nonce, 1 << 20, 'c', ack);
        let at = 0;
        for (const cut of [...cuts].sort((a, b) => a - b)) {
          const to = Math.max(at, Math.min(cut, stream.length));
          scanner.push(stream.subarray(at, to));
          at = to;
        }
        scanner.push(stream.subarray(at));
        expect(scanner.acked).toBe(withAck);
        expect(scanner.outcome).toEqual({ marker: { status: 0, pid: 7, cwd: '/w' }, rest: Buffer.alloc(0) });
        expect(scanner.text()).toBe(Buffer.concat([Buffer.from(before), Buffer.from(after)]).toString('utf8'));
      }),
    );
  });
});

describe('bubblewrap: a shell whose restart fails', () => {
  it('the wall clock ran out while the shell was dead: deadline_exceeded, not a command failure', async () => {
    const sandbox = await startBwrap(bwrap, { ...shellTestLimits, wallClockMs: 2_500 });
    const shell = sandbox.shell();
    await shell.run('(sleep 0.2; kill -9 $$) &');
    await waitFor(() => sandbox.remainingMs <= 0, 10_000, 'the wall clock to run out');
    await expect(shell.run('echo hi')).rejects.toMatchObject({ code: expect.stringMatching(/^(deadline_exceeded|sandbox_error)$/) });
  });
});
