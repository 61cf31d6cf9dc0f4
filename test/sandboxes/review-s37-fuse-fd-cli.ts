// Started by review-s37-host-helper-fds.test.ts with descriptors inherited WITHOUT close-on-exec (as a harness's pipe
// reaches a server): mounts argv[2] (a squashfs) at argv[3] with mountSquashfs, prints the descriptors of the
// squashfuse daemon that serves it (`N -> target` per line), then unmounts.
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { mountSquashfs, unmountFuse } from '../../src/sandboxes/images/fuse-mounts.js';

const [file, mountPoint] = process.argv.slice(2) as [string, string];
await mountSquashfs(file, mountPoint, { offset: 0, allowOther: false, timeoutMs: 30_000 });
let listing = '';
try {
  const daemon = readdirSync('/proc').find((pid) => {
    if (!/^\d+$/.test(pid)) return false;
    try {
      const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      return argv.some((a) => a.endsWith('squashfuse')) && argv.includes(mountPoint);
    } catch {
      return false;
    }
  });
  if (daemon === undefined) throw new Error('no squashfuse daemon found');
  for (const fd of readdirSync(`/proc/${daemon}/fd`)) {
    try {
      listing += `${fd} -> ${readlinkSync(`/proc/${daemon}/fd/${fd}`)}\n`;
    } catch {
      // Closed meanwhile.
    }
  }
} finally {
  await unmountFuse(mountPoint);
}
process.stdout.write(listing);
