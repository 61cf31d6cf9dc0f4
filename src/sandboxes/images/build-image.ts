import { spawn } from 'node:child_process';
import { access, mkdir, mkdtemp, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { RolloutError, throwIfAborted } from '../../errors.js';
import { removeTree } from '../remove-tree.js';
import { listMounts } from './fuse-mounts.js';
import { DEFAULT_IMAGE_CACHE_DIR, imagePath, imageRecipe, recipeHash, type ImageRecipe } from './image-recipe.js';
import { trimRootfs } from './rootfs-trim.js';
import { readSifFile } from './sif.js';

export interface BuildImageOptions {
  /** Debian packages on top of minbase, e.g. ['python3', 'git']. */
  packages: readonly string[];
  /** Debian suite; default bookworm. */
  suite?: string;
  /** Cache of built images; default `<project>/.cache/images`. */
  cacheDir?: string;
  /** Debian mirror; default http://deb.debian.org/debian (a package registry: the only download). */
  mirror?: string;
  signal?: AbortSignal;
  onProgress?: (progress: BuildProgress) => void;
}

/** One step of a build, for progress bars and logs. */
export interface BuildProgress {
  stage: 'debootstrap' | 'trim' | 'squashfs' | 'sif';
  /** What is happening, e.g. "Unpacking perl-base". */
  message: string;
  /** Rough share of the whole build done, 0..1 (debootstrap's share is estimated from its package count). */
  fraction: number;
}

export interface BuiltImage {
  /** The .sif file: `<cacheDir>/debian-<suite>-<arch>-<hash>.sif`. */
  path: string;
  hash: string;
  /** True when the image was already in the cache and nothing was built. */
  cached: boolean;
  recipe: ImageRecipe;
}

/** Every squashfs inode and the super block carry this time, so a rebuild of the same tree gives the same bytes. */
const SOURCE_DATE_EPOCH = '1700000000';
const SYSTEM_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/**
 * Builds a Singularity image (.sif) from Debian packages: debootstrap --variant=minbase with `packages` →
 * trimmed (caches, docs, host files removed) → mksquashfs (zstd, fixed timestamps) → siftool (one primary system
 * partition, plus the recipe as a JSON object). The result is cached under the recipe's hash; an existing file is
 * returned without building. The file appears atomically (rename), so a concurrent reader never sees half an
 * image; two concurrent builds of one recipe both succeed and the last rename wins.
 *
 * Needs root (debootstrap chroots, creates device nodes and files owned by other users): otherwise it fails with
 * failed_precondition saying so, as it does when debootstrap, mksquashfs or siftool is missing. Aborting the
 * signal kills the build and removes its work dir (unmounting what debootstrap mounted inside).
 */
export async function buildImage(options: BuildImageOptions): Promise<BuiltImage> {
  const recipe = imageRecipe(options.packages, options.suite);
  const cacheDir = options.cacheDir ?? DEFAULT_IMAGE_CACHE_DIR;
  const path = imagePath(recipe, cacheDir);
  const hash = recipeHash(recipe);
  if (await exists(path)) return { path, hash, cached: true, recipe };
  throwIfAborted(options.signal);
  if (process.getuid?.() !== 0) {
    throw new RolloutError('failed_precondition', 'building images needs root (debootstrap chroots and creates device nodes and files owned by other users): run `sudo node bin/rollout.js image build`, or scripts/setup.sh as root');
  }
  for (const [tool, pkg] of [['debootstrap', 'debootstrap'], ['mksquashfs', 'squashfs-tools'], ['siftool', 'siftool']] as const) {
    if (!(await onPath(tool))) throw new RolloutError('failed_precondition', `${tool} is not installed (apt-get install ${pkg}): cannot build images`);
  }
  await mkdir(cacheDir, { recursive: true });
  const work = await mkdtemp(join(cacheDir, `.build-${hash}-`));
  const report = (stage: BuildProgress['stage'], message: string, fraction: number) => options.onProgress?.({ stage, message, fraction });
  try {
    const rootfs = join(work, 'rootfs');
    const mirror = options.mirror ?? 'http://deb.debian.org/debian';
    const include = `--include=${recipe.packages.join(',')}`;
    const estimate = new DebootstrapProgress();
    report('debootstrap', `debootstrap ${recipe.suite} (${recipe.packages.join(', ')})`, 0);
    await run('debootstrap', ['--variant=minbase', include, `--arch=${recipe.arch}`, '--components=main', recipe.suite, rootfs, mirror], options.signal, (line) => {
      const fraction = estimate.line(line);
      if (fraction !== undefined) report('debootstrap', line.replace(/^I: /, ''), 0.8 * fraction);
    });
    report('trim', 'removing caches, docs and host files', 0.8);
    await trimRootfs(rootfs);
    report('squashfs', 'mksquashfs (zstd)', 0.82);
    const squashfs = join(work, 'rootfs.squashfs');
    await run('mksquashfs', [rootfs, squashfs, '-noappend', '-comp', 'zstd', '-no-progress', '-quiet'], options.signal);
    report('sif', 'siftool', 0.95);
    const sif = join(work, 'image.sif');
    await packSif({ squashfs, metadata: { ...recipe, hash }, out: sif, arch: recipe.arch, signal: options.signal });
    await rename(sif, path);
    await writeFile(`${path}.json`, `${JSON.stringify({ ...recipe, hash, path, builtAt: new Date().toISOString() }, null, 2)}\n`);
    report('sif', `built ${path}`, 1);
    return { path, hash, cached: false, recipe };
  } finally {
    await unmountUnder(work);
    await removeTree(work);
  }
}

/**
 * Wraps a squashfs root file system into a SIF at `out`: one primary system partition plus `metadata` as a JSON
 * object (what the image was built from), then checks the result with the project's own reader. Shared by the
 * Debian builder here and the builders of derived images (the SWE tasks' images).
 */
export async function packSif(options: { squashfs: string; metadata: Record<string, unknown>; out: string; arch: string; signal?: AbortSignal }): Promise<void> {
  const recipeJson = `${options.out}.rollout-recipe.json`;
  await writeFile(recipeJson, `${JSON.stringify(options.metadata, null, 2)}\n`);
  try {
    await run('siftool', ['new', options.out], options.signal);
    await run('siftool', ['add', options.out, recipeJson, '--datatype', '6'], options.signal);
    await run('siftool', ['add', options.out, options.squashfs, '--datatype', '4', '--parttype', '2', '--partfs', '1', '--partarch', sifArch(options.arch)], options.signal);
  } finally {
    await rm(recipeJson, { force: true });
  }
  await readSifFile(options.out); // what we made must be what our reader accepts
}

/** siftool's --partarch code of a Debian architecture. */
function sifArch(arch: string): string {
  const codes: Record<string, string> = { i386: '1', amd64: '2', armhf: '3', arm64: '4', ppc64el: '6', s390x: '11', riscv64: '12' };
  const code = codes[arch];
  if (!code) throw new RolloutError('failed_precondition', `no SIF architecture code for ${arch}`);
  return code;
}

/**
 * debootstrap's share done, estimated from its "I: Retrieving|Validating|Extracting|Unpacking|Configuring <pkg>"
 * lines: five steps per package, the package count learnt once retrieval ends (guessed before).
 */
class DebootstrapProgress {
  private retrieved = 0;
  private steps = 0;
  private packages: number | undefined;

  line(line: string): number | undefined {
    const match = /^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) [a-z0-9]/.exec(line);
    if (!match) return line.startsWith('I: ') ? this.fraction() : undefined;
    if (match[1] === 'Retrieving') this.retrieved++;
    else this.packages ??= this.retrieved;
    this.steps++;
    return this.fraction();
  }

  private fraction(): number {
    return Math.min(1, this.steps / (5 * Math.max(this.packages ?? 110, this.retrieved, 1)));
  }
}

/**
 * Runs a build tool in its own process group (so an abort kills what it started), lines of stdout to `onLine`;
 * a non-zero exit is an `internal` error with the tool's last lines, a missing tool `failed_precondition`.
 */
export function runBuildTool(command: string, args: string[], signal: AbortSignal | undefined, onLine?: (line: string) => void): Promise<void> {
  return run(command, args, signal, onLine);
}

function run(command: string, args: string[], signal: AbortSignal | undefined, onLine?: (line: string) => void): Promise<void> {
  throwIfAborted(signal);
  return new Promise((resolve, reject) => {
    const env = { ...process.env, PATH: `${process.env.PATH ?? ''}:${SYSTEM_PATH}`, LC_ALL: 'C', DEBIAN_FRONTEND: 'noninteractive', SOURCE_DATE_EPOCH };
    const child = spawn(command, args, { env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    const tail: string[] = [];
    const keep = (line: string) => {
      tail.push(line);
      if (tail.length > 20) tail.shift();
    };
    createInterface({ input: child.stdout }).on('line', (line) => {
      keep(line);
      onLine?.(line);
    });
    createInterface({ input: child.stderr }).on('line', keep);
    const onAbort = () => {
      if (child.pid !== undefined) {
        try {
          process.kill(-child.pid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    child.once('error', (err) => {
      signal?.removeEventListener('abort', onAbort);
      reject(new RolloutError('failed_precondition', `cannot run ${command}: ${err.message}`, { cause: err }));
    });
    child.once('close', (code, killedBy) => {
      signal?.removeEventListener('abort', onAbort);
      if (signal?.aborted) return reject(RolloutError.from(signal.reason, 'cancelled'));
      if (code === 0) return resolve();
      const why = killedBy ? `killed by ${killedBy}` : `exit code ${code}`;
      // A build tool that fails (a mirror unreachable, a package not found, a full disk) is not a bug of ours: its own
      // last lines are the cause, shown as one line by the CLI, without our stack trace.
      reject(new RolloutError('unavailable', `${command} failed (${why}): ${tail.slice(-8).join(' | ')}`));
    });
  });
}

/** Lazily unmounts anything mounted under `dir` (debootstrap mounts /proc and /sys in the target), deepest first. */
async function unmountUnder(dir: string): Promise<void> {
  const inside = (await listMounts()).map((m) => m.mountPoint).filter((p) => p.startsWith(`${dir}/`));
  for (const mountPoint of inside.reverse()) await run('umount', ['-l', mountPoint], undefined).catch(() => undefined);
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    (st) => st.isFile(),
    () => false,
  );
}

async function onPath(tool: string): Promise<boolean> {
  for (const dir of `${process.env.PATH ?? ''}:${SYSTEM_PATH}`.split(':')) {
    if (dir && (await access(join(dir, tool)).then(() => true, () => false))) return true;
  }
  return false;
}
