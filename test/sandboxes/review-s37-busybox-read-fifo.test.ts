import { existsSync, rmSync } from 'node:fs';
import { afterAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import { DEFAULT_SANDBOX_INIT, SANDBOX_INIT_PATH } from '../../src/sandboxes/init/sandbox-init.js';
import type { Sandbox } from '../../src/sandboxes/types.js';
import { closeAfterAll, testSpec, waitForFileInSandbox } from './helpers.js';
import { busyboxRoot, STATIC_BUSYBOX } from './review-s37-busybox-root.js';

const outcome = (p: Promise<unknown>): Promise<string> =>
  p.then(
    (v) => (v === 'hello\n' ? 'ok' : `ok but read ${JSON.stringify(String(v).slice(0, 20))}`),
    (err: unknown) => (err instanceof RolloutError ? err.code : String(err)),
  );

// Review s37: the FIFO race of file reads (and writes) in an image without GNU dd. readFile checked that the path was a regular
// file and then opened it with head (busybox's dd has no iflag=nonblock, so the O_NONBLOCK read of s36 fell through): a
// FIFO the program put at the path in between blocked the open until the command timeout — deadline_exceeded, an
// infrastructure failure, for what the model did in its own workspace. Reads now go through the sandbox init's
// --read-file / --write-file (O_NONBLOCK open, fstat of what was opened), which need no tool of the image.
describe.skipIf(STATIC_BUSYBOX === undefined || !existsSync(DEFAULT_SANDBOX_INIT))('readFile and writeFile in a busybox image (no GNU dd)', () => {
  const root = STATIC_BUSYBOX === undefined ? '' : busyboxRoot();
  afterAll(() => rmSync(root, { recursive: true, force: true }));
  const driver = closeAfterAll(new BubblewrapDriver());
  let sandbox: Sandbox | undefined;
  afterAll(() => sandbox?.stop());
  const started = async (): Promise<Sandbox> => (sandbox ??= await driver.start(testSpec({ image: root, commandTimeoutMs: 3_000, wallClockMs: 120_000 })));

  it('the image really has no dd that opens without blocking', async () => {
    const r = await (await started()).exec(['sh', '-c', 'dd if=/dev/null iflag=nonblock count=0']);
    expect(r.exitCode).not.toBe(0);
  });

  it('the init\'s --read-file refuses a FIFO at once (exit NOTREG) and copies at most MAX bytes of a file', async () => {
    const s = await started();
    await s.exec(['sh', '-c', 'rm -f fifo file && mkfifo fifo && echo hello world > file']);
    const fifo = await s.exec([SANDBOX_INIT_PATH, '--read-file', '22', '4096', 'fifo']);
    expect({ exitCode: fifo.exitCode, timedOut: fifo.timedOut }).toEqual({ exitCode: 22, timedOut: false });
    const file = await s.exec([SANDBOX_INIT_PATH, '--read-file', '22', '5', 'file']);
    expect({ exitCode: file.exitCode, stdout: file.stdout }).toEqual({ exitCode: 0, stdout: 'hello' });
  });

  // listDir read GNU find's -printf, which busybox's find lacks: every listing of such an image failed.
  it('lists a directory through the init\u2019s --list-dir, as GNU find would (types, file sizes, odd names)', async () => {
    const s = await started();
    await s.exec(['sh', '-c', 'rm -rf ls && mkdir -p ls/sub && printf 12345 > ls/five && ln -s five ls/link && mkfifo ls/pipe && printf x > "ls/new\nline"']);
    expect(await s.listDir('ls')).toEqual([
      { name: 'five', type: 'file', size: 5 },
      { name: 'link', type: 'symlink', size: 0 },
      { name: 'new\nline', type: 'file', size: 1 },
      { name: 'pipe', type: 'other', size: 0 },
      { name: 'sub', type: 'dir', size: 0 },
    ]);
    await expect(s.listDir('ls/five')).rejects.toMatchObject({ code: 'invalid_argument' });
  });

  it('never blocks on a FIFO swapped in after the check: each read returns the file or is refused as the path\'s fault', async () => {
    const s = await started();
    const swapping = s.spawn(['sh', '-c', 'while :; do mkfifo .f 2>/dev/null; mv -f .f x; echo hello > .r; mv -f .r x; done']);
    swapping.stdin.end();
    await waitForFileInSandbox(s, 'x');
    const seen = new Map<string, number>();
    for (let i = 0; i < 60; i++) {
      const code = await outcome(s.readFile('x'));
      seen.set(code, (seen.get(code) ?? 0) + 1);
    }
    swapping.kill();
    await swapping.exited;
    // Never a timeout (deadline_exceeded), never a FIFO's nothing passed off as the file's content.
    expect([...seen.keys()].filter((code) => code !== 'ok' && code !== 'invalid_argument'), JSON.stringify([...seen])).toEqual([]);
    await s.exec(['sh', '-c', 'rm -f x && echo hello > x']);
    expect(await s.readFile('x')).toBe('hello\n');
  }, 300_000);

  // The write side, the same way: `cat > x` blocked on a FIFO put there after the check until the command timeout.
  it('never blocks a write on a FIFO swapped in after the check: each write lands or is refused as the path\'s fault', async () => {
    const s = await started();
    const swapping = s.spawn(['sh', '-c', 'while :; do mkfifo .f 2>/dev/null; mv -f .f y; echo hello > .r; mv -f .r y; done']);
    swapping.stdin.end();
    await waitForFileInSandbox(s, 'y');
    const seen = new Map<string, number>();
    for (let i = 0; i < 60; i++) {
      const code = await s.writeFile('y', 'written\n').then(() => 'ok', (err: unknown) => (err instanceof RolloutError ? err.code : String(err)));
      seen.set(code, (seen.get(code) ?? 0) + 1);
    }
    swapping.kill();
    await swapping.exited;
    expect([...seen.keys()].filter((code) => code !== 'ok' && code !== 'invalid_argument'), JSON.stringify([...seen])).toEqual([]);
    await s.exec(['sh', '-c', 'rm -f y']);
    await s.writeFile('y', 'written\n');
    expect(await s.readFile('y')).toBe('written\n');
  }, 300_000);

  it('the init\'s --write-file fails at once on a FIFO (no reader: ENXIO) and writes nothing to one with a reader', async () => {
    const s = await started();
    await s.exec(['sh', '-c', 'rm -f wfifo && mkfifo wfifo']);
    const noReader = await s.exec([SANDBOX_INIT_PATH, '--write-file', '22', 'wfifo'], { stdin: 'data' });
    expect({ exitCode: noReader.exitCode, timedOut: noReader.timedOut }).toEqual({ exitCode: 1, timedOut: false });
    expect(noReader.stderr).toMatch(/No such device or address/);
    // The shell holds the FIFO open for reading (and writing, so its own open does not block); what the helper wrote,
    // if anything, comes before the shell's own line.
    const withReader = await s.exec(['sh', '-c', 'exec 3<>wfifo; "$0" --write-file 22 wfifo; s=$?; echo end >&3; read -r line <&3; echo "$s:$line"', SANDBOX_INIT_PATH], { stdin: 'data' });
    expect(withReader.stdout).toBe('22:end\n');
  });
});
