import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { removeTree } from '../../src/sandboxes/remove-tree.js';

const isRoot = process.getuid?.() === 0;
/** An unprivileged uid that owns nothing on this machine (the range the bwrap driver drops sandboxes to). */
const OTHER_UID = 0x60000000 + 4242;
const cli = fileURLToPath(new URL('./remove-tree-cli.ts', import.meta.url));

let base: string;
beforeEach(() => {
  base = mkdtempSync(join(tmpdir(), 'remove-tree-test-'));
  chmodSync(base, 0o755);
});
afterEach(() => {
  execFileSync('rm', ['-rf', '--one-file-system', base]);
});

/** Builds a tree with bash (relative mkdir + cd; dash cannot cd past PATH_MAX), the way a sandboxed program would: no path is ever absolute. */
function sh(script: string, cwd: string, uid?: number): void {
  const argv = uid === undefined ? ['bash', '-c', script] : ['setpriv', '--reuid', String(uid), '--regid', String(uid), '--clear-groups', 'bash', '-c', script];
  execFileSync(argv[0]!, argv.slice(1), { cwd, stdio: ['ignore', 'ignore', 'pipe'] });
}

const deepScript = `n=$(printf 'd%.0s' $(seq 250)); for i in $(seq 40); do mkdir "$n" && cd "$n" || exit 1; done; echo bottom > file`;

describe('removeTree', () => {
  it('removes a tree deeper than PATH_MAX (40 levels of 250-character names)', async () => {
    const dir = join(base, 'work');
    mkdirSync(dir);
    sh(deepScript, dir);
    await removeTree(dir);
    expect(existsSync(dir)).toBe(false);
  });

  it('removes unreadable (000) and read-only (555) directories and read-only files', async () => {
    const dir = join(base, 'work');
    mkdirSync(dir);
    sh('mkdir -p a/b/c ro && echo x > a/b/c/f && echo y > ro/f && chmod 444 ro/f && chmod 555 ro && chmod 000 a/b a', dir);
    await removeTree(dir);
    expect(existsSync(dir)).toBe(false);
  });

  it('removes files and directories owned by another uid', async () => {
    if (!isRoot) return; // only root can give files away
    const dir = join(base, 'work');
    mkdirSync(dir);
    sh(`mkdir -p theirs/deeper && echo x > theirs/deeper/f && chown -R ${OTHER_UID}:${OTHER_UID} theirs && chmod 700 theirs`, dir);
    await removeTree(dir);
    expect(existsSync(dir)).toBe(false);
  });

  it('removes FIFOs, sockets and symlinks without following the links out of the tree', async () => {
    const outside = join(base, 'outside');
    mkdirSync(outside);
    writeFileSync(join(outside, 'keep'), 'precious');
    const dir = join(base, 'work');
    mkdirSync(dir);
    sh(
      `mkfifo fifo && python3 -c "import socket; socket.socket(socket.AF_UNIX).bind('sock')" && ` +
        `ln -s '${outside}' dirlink && ln -s '${join(outside, 'keep')}' filelink && ln -s /nonexistent dangling && mkdir sub && ln -s .. sub/up`,
      dir,
    );
    await removeTree(dir);
    expect(existsSync(dir)).toBe(false);
    expect(readFileSync(join(outside, 'keep'), 'utf8')).toBe('precious');
  });

  it('unlinks a work dir that is itself a symlink, leaving its target alone', async () => {
    const target = join(base, 'target');
    mkdirSync(target);
    writeFileSync(join(target, 'keep'), 'precious');
    const link = join(base, 'work');
    symlinkSync(target, link);
    await removeTree(link);
    expect(() => lstatSync(link)).toThrow();
    expect(readFileSync(join(target, 'keep'), 'utf8')).toBe('precious');
  });

  it('treats a missing directory as removed', async () => {
    await expect(removeTree(join(base, 'never-existed'))).resolves.toBeUndefined();
  });

  it('removes, as a non-root owner, a deep tree with 000 and 555 directories', async () => {
    if (!isRoot) return; // needs root to run the removal as another, unprivileged uid
    const dir = join(base, 'work');
    mkdirSync(dir);
    execFileSync('chown', [`${OTHER_UID}:${OTHER_UID}`, base, dir]); // the server owns its work dirs' parent
    sh(`${deepScript}; chmod 444 file; cd "${dir}" && mkdir -p a/b ro && echo y > ro/f && chmod 555 ro && chmod 000 a/b a`, dir, OTHER_UID);
    execFileSync(
      'setpriv',
      ['--reuid', String(OTHER_UID), '--regid', String(OTHER_UID), '--clear-groups', process.execPath, '--import', 'tsx', cli, dir],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    expect(existsSync(dir)).toBe(false);
  });
});
