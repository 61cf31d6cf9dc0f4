import { spawnSync } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * A static busybox (busybox-static, which scripts/setup.sh installs), or undefined: a dynamic one (Debian's `busybox`)
 * cannot run alone in an image, so tests that need it skip.
 */
export const STATIC_BUSYBOX = ['/usr/bin/busybox', '/bin/busybox'].find((p) => existsSync(p) && !readFileSync(p).subarray(0, 4096).includes('ld-linux'));

/** A directory image of busybox alone (every applet a symlink in /bin): no GNU tool, no bash, no dash. */
export function busyboxRoot(): string {
  const root = mkdtempSync(join(tmpdir(), 'review-s37-busybox-'));
  chmodSync(root, 0o755);
  mkdirSync(join(root, 'bin'), { mode: 0o755 });
  copyFileSync(STATIC_BUSYBOX!, join(root, 'bin/busybox'));
  chmodSync(join(root, 'bin/busybox'), 0o755);
  const applets = spawnSync(STATIC_BUSYBOX!, ['--list'], { encoding: 'utf8' }).stdout.split('\n').filter((a) => /^[\w.[-]+$/.test(a) && a !== 'busybox');
  for (const applet of applets) symlinkSync('busybox', join(root, 'bin', applet));
  for (const dir of ['usr', 'usr/bin', 'etc']) mkdirSync(join(root, dir), { mode: 0o755 });
  return root;
}
