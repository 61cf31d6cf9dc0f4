import { afterAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { ApptainerDriver } from '../../src/sandboxes/apptainer.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { Sandbox, SandboxDriver } from '../../src/sandboxes/types.js';
import { makeApptainerDouble } from './apptainer-double.js';
import { closeAfterAll, testSpec, waitForFileInSandbox } from './helpers.js';

/** Replaces <workdir>/x by a FIFO (or a symlink to /dev/zero) and back by a regular file, as fast as it can. */
const swapper = (workdir: string, kind: 'fifo' | 'zero'): string => `
import os
os.chdir(${JSON.stringify(workdir)})
while True:
    try:
        ${kind === 'fifo' ? 'os.mkfifo(".f")' : 'os.symlink("/dev/zero", ".f")'}
    except FileExistsError:
        pass
    os.replace(".f", "x")
    with open(".r", "w") as f:
        f.write("hello\\n")
    os.replace(".r", "x")
`;

const outcome = (p: Promise<unknown>): Promise<string> =>
  p.then(
    (v) => (v === 'hello\n' ? 'ok' : `ok but read ${JSON.stringify(String(v).slice(0, 20))}`),
    (err: unknown) => (err instanceof RolloutError ? err.code : String(err)),
  );

const double = makeApptainerDouble();
afterAll(() => double.cleanup());
const drivers: Array<[string, () => SandboxDriver, string | undefined]> = [
  ['bubblewrap', () => new BubblewrapDriver(), undefined],
  ['apptainer driver over the apptainer TEST DOUBLE', () => new ApptainerDriver({ binary: double.binary, tmpRoot: double.tmpRoot }), '/'],
];

// Review s36: the read side of the s35 FIFO race. readFile checked that the path was a regular file, then opened it
// (head): a FIFO the program put there in between blocked the open until the command timeout, and the read failed as
// deadline_exceeded — an infrastructure timeout (the editor's `view`, and so the trajectory) for what the model did
// in its own workspace.
describe.each(drivers)('readFile against a program that swaps the path (%s)', (_name, makeDriver, image) => {
  const driver = closeAfterAll(makeDriver());
  let sandbox: Sandbox | undefined;
  afterAll(() => sandbox?.stop());
  const start = async (): Promise<Sandbox> => {
    await sandbox?.stop();
    sandbox = await driver.start({ ...testSpec({ commandTimeoutMs: 3_000, wallClockMs: 120_000, ...(image !== undefined && { image }) }) });
    return sandbox;
  };

  it('never blocks on a FIFO swapped in after the check: each read returns the file or is refused as the path\'s fault, at once', async () => {
    const s = await start();
    const swapping = s.spawn(['python3', '-c', swapper(s.workdir, 'fifo')]);
    await waitForFileInSandbox(s, 'x');
    for (let i = 0; i < 60; i++) {
      const started = performance.now();
      const code = await outcome(s.readFile('x'));
      // Never a FIFO's nothing passed off as the file's content ('ok but read ""'), never a timeout.
      expect(code).toMatch(/^(ok|invalid_argument)$/);
      expect(performance.now() - started).toBeLessThan(2_500);
    }
    // Once the path holds still, it reads as the file it is.
    swapping.kill();
    await swapping.exited;
    await s.exec(['sh', '-c', 'rm -f x && echo hello > x']);
    expect(await s.readFile('x')).toBe('hello\n');
  }, 120_000);

  it('reads no more than the limit of a symlink to /dev/zero swapped in after the check', async () => {
    const s = await start();
    s.spawn(['python3', '-c', swapper(s.workdir, 'zero')]);
    await waitForFileInSandbox(s, 'x');
    for (let i = 0; i < 40; i++) {
      const started = performance.now();
      const code = await outcome(s.readFile('x', { maxBytes: 1024 }));
      expect(code).toMatch(/^(ok|invalid_argument)$/);
      expect(performance.now() - started).toBeLessThan(2_500);
    }
  }, 120_000);

  it('refuses a FIFO, a symlink to /dev/zero and a large sparse file at once, as the path\'s fault', async () => {
    const s = await start();
    await s.exec(['sh', '-c', 'mkfifo fifo && ln -s /dev/zero zero && truncate -s 200M sparse']);
    for (const path of ['fifo', 'zero', 'sparse']) {
      const started = performance.now();
      await expect(s.readFile(path), path).rejects.toMatchObject({ code: 'invalid_argument' });
      expect(performance.now() - started, path).toBeLessThan(2_500);
    }
  }, 60_000);
});
