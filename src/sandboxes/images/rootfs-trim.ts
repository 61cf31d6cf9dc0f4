import { chmod, mkdir, readdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { removeTree } from '../remove-tree.js';

/**
 * Makes a freshly debootstrapped root file system small and free of the build host's traces before it is
 * squashed: package caches and lists, docs, man pages, translations, logs and backup files go (the directories
 * stay, so dpkg and apt still work in a derived image); host files debootstrap copied in (hostname, resolv.conf,
 * hosts) are replaced by neutral ones; and the directories a sandbox mounts over exist, since the image is
 * read-only and bwrap cannot create mount points in it.
 */
export async function trimRootfs(rootfs: string): Promise<void> {
  const emptied = [
    'var/cache/apt',
    'var/lib/apt/lists',
    'var/log',
    'usr/share/doc',
    'usr/share/man',
    'usr/share/info',
    'usr/share/locale',
    'usr/share/lintian',
    'tmp',
    'var/tmp',
  ];
  for (const dir of emptied) await emptyDir(join(rootfs, dir));
  for (const file of ['var/cache/ldconfig/aux-cache', 'etc/hostname', 'etc/machine-id']) await removeTree(join(rootfs, file));
  for (const dir of ['var/lib/dpkg', 'var/cache/debconf']) {
    const names = await readdir(join(rootfs, dir)).catch(() => []);
    for (const name of names) if (name.endsWith('-old')) await removeTree(join(rootfs, dir, name));
  }
  await writeFile(join(rootfs, 'etc/resolv.conf'), '');
  await writeFile(join(rootfs, 'etc/hosts'), '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n');
  for (const dir of ['proc', 'dev', 'sys', 'tmp', 'var/tmp', 'work', 'root']) await mkdir(join(rootfs, dir), { recursive: true });
  await chmod(join(rootfs, 'tmp'), 0o1777);
  await chmod(join(rootfs, 'var/tmp'), 0o1777);
  await writeSingularityMetadata(rootfs);
}

async function emptyDir(dir: string): Promise<void> {
  const names = await readdir(dir).catch(() => []);
  for (const name of names) await removeTree(join(dir, name));
}

/**
 * Apptainer/Singularity run every command through `/.singularity.d/actions/<action>` inside the image and source
 * `/.singularity.d/env/*.sh` first; images they did not build must bring these (a minimal set, as `apptainer
 * build` writes for a bare root file system), or `apptainer exec` fails with "no such file or directory".
 */
async function writeSingularityMetadata(rootfs: string): Promise<void> {
  const base = join(rootfs, '.singularity.d');
  for (const dir of ['actions', 'env', 'libs']) await mkdir(join(base, dir), { recursive: true });
  const sourceEnv = 'for script in /.singularity.d/env/*.sh; do\n    if [ -f "$script" ]; then\n        . "$script"\n    fi\ndone\n';
  const actions: Record<string, string> = {
    exec: `#!/bin/sh\n${sourceEnv}exec "$@"\n`,
    run: `#!/bin/sh\n${sourceEnv}exec /.singularity.d/runscript "$@"\n`,
    shell: `#!/bin/sh\n${sourceEnv}exec /bin/bash "$@"\n`,
    start: `#!/bin/sh\n${sourceEnv}exec "$@"\n`,
    test: `#!/bin/sh\n${sourceEnv}exit 0\n`,
  };
  for (const [name, script] of Object.entries(actions)) await writeFile(join(base, 'actions', name), script, { mode: 0o755 });
  await writeFile(join(base, 'env', '01-base.sh'), 'export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"\n', { mode: 0o755 });
  await writeFile(join(base, 'runscript'), '#!/bin/sh\nexec "$@"\n', { mode: 0o755 });
}
