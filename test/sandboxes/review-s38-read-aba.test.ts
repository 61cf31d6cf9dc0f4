import { execFile } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { FILE_EXIT, READ_FILE_SCRIPT } from '../../src/sandboxes/apptainer-files.js';
import { SandboxFiles, type RunInside } from '../../src/sandboxes/sandbox-files.js';

// Review s38: the identity check of readNonblock (the read path of sandboxes without the init: the Apptainer driver,
// bubblewrap without the built init) compared the path's device and inode before and after the read. A program that
// swaps its file for a FIFO and back during the read passed it: the FIFO's nothing came back as the file's content
// (flaky in review-s36-read-fifo-race, about one run in two on this machine, where ext4 hands a freed inode number to
// the next file). Here the swap is made deterministic: a `dd` earlier on PATH moves the very file away, puts a FIFO at
// the path, runs the real dd on it and moves the file back — the same inode before and after.

const root = mkdtempSync(join(tmpdir(), 'rollout-s38-aba-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const shim = join(root, 'bin');
const work = join(root, 'work');
for (const dir of [shim, work]) mkdirSync(dir);
writeFileSync(
  join(shim, 'dd'),
  `#!/bin/sh
# A test double in front of the real dd: the reading call (if=<file>, not /dev/null) runs with a FIFO at that path.
case "$1" in if=/dev/null|if=) exec /usr/bin/dd "$@" ;; esac
p=\${1#if=}
[ -f "$p.swap" ] || exec /usr/bin/dd "$@"
mv "$p" "$p.away" && mkfifo "$p" || exit 99
/usr/bin/dd "$@"; s=$?
rm -f "$p" && mv "$p.away" "$p"
exit $s
`,
);
chmodSync(join(shim, 'dd'), 0o755);

/** Runs a file script on this host with the dd double first on PATH: the host stands in for the sandbox. */
const runOnHost: RunInside = (argv, options) =>
  new Promise((resolve) => {
    const child = execFile(argv[0]!, argv.slice(1), { env: { ...process.env, PATH: `${shim}:${process.env.PATH ?? ''}` }, maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
      const e = err as (NodeJS.ErrnoException & { code?: unknown; signal?: NodeJS.Signals | null }) | null;
      resolve({
        exitCode: e === null ? 0 : typeof e.code === 'number' ? e.code : null,
        signal: e?.signal ?? null,
        stdout,
        stderr,
        truncated: stdout.length > options.outputLimitBytes,
        timedOut: false,
      });
    });
    child.stdin?.end(options.stdin ?? '');
  });

describe('a read whose file is swapped for a FIFO and back during the read (same inode after as before)', () => {
  it('SandboxFiles (bubblewrap without the init) refuses it as replaced, never returns the FIFO\'s nothing', async () => {
    writeFileSync(join(work, 'x'), 'hello\n');
    const files = new SandboxFiles(work, runOnHost);
    expect(await files.read('x')).toBe('hello\n'); // no swap marker yet: the double is the real dd
    writeFileSync(join(work, 'x.swap'), '');
    const got = await files.read('x').then((v) => `read ${JSON.stringify(v)}`, (err: unknown) => (err instanceof RolloutError ? `${err.code}: ${err.message}` : String(err)));
    expect(got).toMatch(/^invalid_argument: .*x was replaced while it was read/);
    rmSync(join(work, 'x.swap'));
    expect(await files.read('x')).toBe('hello\n');
  });

  it('the Apptainer read script exits "changed" on it', async () => {
    writeFileSync(join(work, 'y'), 'hello\n');
    writeFileSync(join(work, 'y.swap'), '');
    const r = await runOnHost(['/bin/sh', '-c', READ_FILE_SCRIPT, 'read', join(work, 'y'), '1024'], { outputLimitBytes: 8192 });
    expect({ exitCode: r.exitCode, stdout: r.stdout }).toEqual({ exitCode: FILE_EXIT.changed, stdout: '' });
  });

  it('an empty file is still read as empty, and a file read whole is not refused', async () => {
    writeFileSync(join(work, 'empty'), '');
    writeFileSync(join(work, 'big'), 'z'.repeat(100_000));
    const files = new SandboxFiles(work, runOnHost);
    expect(await files.read('empty')).toBe('');
    expect((await files.read('big')).length).toBe(100_000);
    await expect(files.read('big', { maxBytes: 1000 })).rejects.toMatchObject({ code: 'invalid_argument' });
  });
});
