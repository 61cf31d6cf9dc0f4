import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';

/** SIF's architecture code of this machine (siftool's --partarch). */
export function sifArchCode(): number {
  const codes: Record<string, number> = { ia32: 1, x64: 2, arm: 3, arm64: 4, ppc64: 5, s390x: 11, riscv64: 12 };
  const code = codes[process.arch];
  if (code === undefined) throw new Error(`no SIF architecture code for ${process.arch}`);
  return code;
}

/**
 * A root file system of a few files: the host's dash as /bin/sh, cat and setpriv (to drop to another uid inside
 * the sandbox, as the bwrap driver does as root) with the libraries they link, empty /proc, /dev and /tmp for
 * bwrap to mount over, and /hello.txt. Enough for `sh -c 'echo ok'` under bwrap; no debootstrap.
 */
export function makeTinyRootfs(dir: string): void {
  mkdirSync(join(dir, 'bin'), { recursive: true });
  for (const d of ['proc', 'dev', 'tmp']) mkdirSync(join(dir, d));
  const programs: [string, string][] = [
    ['/bin/dash', 'bin/sh'],
    ['/bin/cat', 'bin/cat'],
    ['/usr/bin/setpriv', 'bin/setpriv'],
  ];
  for (const [host, inImage] of programs) {
    copyFileSync(host, join(dir, inImage));
    for (const lib of linkedLibraries(host)) {
      mkdirSync(join(dir, dirname(lib)), { recursive: true });
      copyFileSync(lib, join(dir, lib));
    }
  }
  writeFileSync(join(dir, 'hello.txt'), 'hello from the image\n');
}

function linkedLibraries(program: string): string[] {
  return execFileSync('ldd', [program], { encoding: 'utf8' })
    .split('\n')
    .map((line) => /(\/\S+)\s+\(0x/.exec(line)?.[1])
    .filter((path): path is string => path !== undefined);
}

/** Packs a directory into a squashfs file (mksquashfs, owners reset to root). */
export function makeSquashfs(rootfs: string, out: string): void {
  execFileSync('mksquashfs', [rootfs, out, '-noappend', '-quiet', '-no-progress', '-all-root'], { stdio: 'ignore' });
}

/** Options of one `siftool add` of a partition. */
export interface PartitionObject {
  file: string;
  /** 1 System, 2 primary system (default), 3 data, 4 overlay. */
  parttype?: number;
  /** 1 squashfs (default), 2 ext3, 3 immutable object archive, 4 raw. */
  partfs?: number;
}

/** A SIF holding, in order, an optional definition file and the given partitions, made with siftool. */
export function makeSif(out: string, partitions: readonly PartitionObject[], deffile?: string): void {
  execFileSync('siftool', ['new', out], { stdio: 'ignore' });
  if (deffile) execFileSync('siftool', ['add', out, deffile, '--datatype', '1'], { stdio: 'ignore' });
  for (const p of partitions) {
    const args = ['--datatype', '4', '--parttype', String(p.parttype ?? 2), '--partfs', String(p.partfs ?? 1), '--partarch', String(sifArchCode())];
    execFileSync('siftool', ['add', out, p.file, ...args], { stdio: 'ignore' });
  }
}

/** The tiny image as a SIF in `dir` (rootfs, squashfs and SIF side by side); returns the SIF's path. */
export function makeTinySif(dir: string, name = 'tiny.sif'): string {
  const rootfs = join(dir, `${name}.rootfs`);
  makeTinyRootfs(rootfs);
  const squashfs = join(dir, `${name}.squashfs`);
  makeSquashfs(rootfs, squashfs);
  const sif = join(dir, name);
  makeSif(sif, [{ file: squashfs }]);
  return sif;
}

/** The start offset of SIF object `id` as siftool lists it (the reference our parser is checked against). */
export function siftoolObjectStart(sif: string, id: number): number {
  const listing = execFileSync('siftool', ['list', sif], { encoding: 'utf8' });
  const row = listing.split('\n').find((line) => line.trim().startsWith(`${id} `));
  const match = row === undefined ? null : /\|(\d+)-(\d+)\s*\|/.exec(row);
  if (!match) throw new Error(`siftool lists no object ${id}:\n${listing}`);
  return Number(match[1]);
}
