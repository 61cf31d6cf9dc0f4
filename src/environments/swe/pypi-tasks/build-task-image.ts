import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { chmod, mkdir, mkdtemp, readdir, rename, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { fileURLToPath } from 'node:url';
import { RolloutError, throwIfAborted } from '../../../errors.js';
import type { Logger } from '../../../observability/logger.js';
import { buildImage, packSif, runBuildTool, type BuiltImage } from '../../../sandboxes/images/build-image.js';
import { debianArch } from '../../../sandboxes/images/image-recipe.js';
import { readSifFile } from '../../../sandboxes/images/sif.js';
import { removeTree } from '../../../sandboxes/remove-tree.js';
import { fetchSdist } from './pypi-sdist.js';
import { TASK_REPO_PATH, type SweTask } from './task-definition.js';

/**
 * Debian packages of the one base image every task image extends: Python, pytest, git (the environment diffs and
 * applies patches with it), patch (its fallback), and the test-only dependencies of the five tasks (six for
 * dateutil, PyYAML for Markdown, pretend for packaging). All from the Debian registry.
 */
export const SWE_BASE_PACKAGES: readonly string[] = ['git', 'patch', 'python3', 'python3-pretend', 'python3-pytest', 'python3-six', 'python3-yaml'];

/** Bumped whenever the steps below change what comes out; part of every task image's hash. */
const TASK_BUILDER_VERSION = 1;

/** `<project>/.cache/swe`: sdists (sdists/) and task images (images/). */
export const DEFAULT_SWE_CACHE_DIR = fileURLToPath(new URL('../../../../.cache/swe', import.meta.url));

export interface BuildTaskImageOptions {
  /** sdists and task images; default `<project>/.cache/swe`. */
  cacheDir?: string;
  /** Where the base image is built and cached (default the project's .cache/images, content-hashed). */
  baseCacheDir?: string;
  indexUrl?: string;
  signal?: AbortSignal;
  logger?: Logger;
}

export interface BuiltTaskImage {
  path: string;
  hash: string;
  cached: boolean;
}

/**
 * The image of one task: the base image (SWE_BASE_PACKAGES, built once by the content-hashed Debian builder) with
 * the task's release at /testbed — its sdist unpacked, the fix and its test reverted (`git apply -R`), made a git
 * repository at that state — appended to the base's squashfs (mksquashfs appends without recompressing the base).
 * Before packing, the builder checks the task is well formed: the gold patch and the test patch apply forward to
 * the base. Cached under `<cacheDir>/images/swe-<id>-<hash>.sif`, the hash covering the base image, the sdist's
 * SHA-256, both patches and the builder version; the file appears atomically. Needs root only if the base image
 * is not built yet (debootstrap).
 */
export async function buildTaskImage(task: SweTask, options: BuildTaskImageOptions = {}): Promise<BuiltTaskImage> {
  const cacheDir = options.cacheDir ?? DEFAULT_SWE_CACHE_DIR;
  const log = options.logger?.child({ component: 'swe-task-image', task: task.id });
  const signal = options.signal;
  log?.info('base image (Debian: %s)', SWE_BASE_PACKAGES.join(', '));
  const base: BuiltImage = await buildImage({ packages: SWE_BASE_PACKAGES, cacheDir: options.baseCacheDir, signal });
  const hash = createHash('sha256')
    .update(JSON.stringify({ builder: TASK_BUILDER_VERSION, base: base.hash, sdist: task.sdist.sha256, fix: task.fixPatch, test: task.testPatch, repo: TASK_REPO_PATH }))
    .digest('hex')
    .slice(0, 16);
  const path = join(cacheDir, 'images', `swe-${task.id}-${hash}.sif`);
  if (await isFile(path)) {
    log?.info({ path }, 'cached');
    return { path, hash, cached: true };
  }
  const sdist = await fetchSdist({
    project: task.project,
    filename: task.sdist.filename,
    sha256: task.sdist.sha256,
    cacheDir: join(cacheDir, 'sdists'),
    indexUrl: options.indexUrl,
    signal,
    onProgress: (message) => log?.info(message),
  });
  await mkdir(join(cacheDir, 'images'), { recursive: true });
  const work = await mkdtemp(join(cacheDir, `.build-${task.id}-`));
  try {
    log?.info('unpacking %s', task.sdist.filename);
    const unpacked = join(work, 'unpacked');
    await mkdir(unpacked);
    await runBuildTool('tar', ['-xzf', sdist, '-C', unpacked, '--no-same-owner', '--no-same-permissions'], signal);
    const tops = await readdir(unpacked);
    if (tops.length !== 1) throw new RolloutError('failed_precondition', `${task.sdist.filename} should hold one top-level folder, not ${tops.length}`);
    const stage = join(work, 'stage');
    const repo = join(stage, TASK_REPO_PATH.slice(1));
    await mkdir(stage);
    await rename(join(unpacked, tops[0]!), repo);
    await makeBaseRepository(repo, work, task, signal);
    log?.info('appending %s to the base squashfs', TASK_REPO_PATH);
    const squashfs = join(work, 'rootfs.squashfs');
    const partition = await readSifFile(base.path);
    await pipeline(createReadStream(base.path, { start: partition.offset, end: partition.offset + partition.size - 1 }), createWriteStream(squashfs), { signal });
    await runBuildTool('mksquashfs', [stage, squashfs, '-all-root', '-no-recovery', '-no-progress', '-quiet'], signal);
    const sif = join(work, 'image.sif');
    const metadata = { task: task.id, project: task.project, version: task.version, sdist: task.sdist, base: base.hash, hash, builder: TASK_BUILDER_VERSION };
    await packSif({ squashfs, metadata, out: sif, arch: debianArch(), signal });
    await rename(sif, path);
    await writeFile(`${path}.json`, `${JSON.stringify({ ...metadata, path, builtAt: new Date().toISOString() }, null, 2)}\n`);
    log?.info({ path }, 'built');
    return { path, hash, cached: false };
  } finally {
    await removeTree(work);
  }
}

/**
 * Turns the unpacked release into the task's base: a git repository (so the environment diffs against it) at the
 * release minus the fix and minus its test, checked so that both patches apply forward again.
 */
async function makeBaseRepository(repo: string, work: string, task: SweTask, signal: AbortSignal | undefined): Promise<void> {
  const git = (...args: string[]) => runBuildTool('git', ['-C', repo, '-c', 'user.name=rollout', '-c', 'user.email=rollout@localhost', '-c', 'commit.gpgsign=false', ...args], signal);
  const fix = join(work, 'fix.patch');
  const test = join(work, 'test.patch');
  await writeFile(fix, task.fixPatch);
  await writeFile(test, task.testPatch);
  // A repository of its own first: inside another one (this project's checkout) git apply would take paths from that one's root.
  await git('init', '-q', '-b', 'main');
  try {
    await git('apply', '-R', '--whitespace=nowarn', test);
    await git('apply', '-R', '--whitespace=nowarn', fix);
  } catch (err) {
    throw new RolloutError('failed_precondition', `task ${task.id}: its patches do not reverse-apply to ${task.sdist.filename}: ${(err as Error).message}`, { cause: err });
  }
  // The sandbox's user must read everything (sdists carry their authors' modes); before the commit, so git records these.
  await chmod(repo, 0o755);
  await chmodTree(repo, join(repo, '.git'));
  await writeFile(join(repo, '.git', 'info', 'exclude'), '__pycache__/\n*.py[cod]\n.pytest_cache/\n');
  await git('add', '-A');
  await git('commit', '-q', '--no-verify', '--date=@1700000000', '-m', `${task.project} ${task.version} without the fix of ${task.upstream}`);
  await git('apply', '--check', fix);
  await git('apply', '--check', test);
  await chmodTree(join(repo, '.git'));
  throwIfAborted(signal);
}

/** Directories 0755, files 0644 or 0755 (if executable by anyone), below `dir`, skipping `skip`. */
async function chmodTree(dir: string, skip?: string): Promise<void> {
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (path === skip) continue;
    if (entry.isDirectory()) {
      await chmod(path, 0o755);
      await chmodTree(path, skip);
    } else if (entry.isFile()) {
      const { mode } = await stat(path);
      await chmod(path, mode & 0o111 ? 0o755 : 0o644);
    }
  }
}

async function isFile(path: string): Promise<boolean> {
  return stat(path).then(
    (s) => s.isFile(),
    () => false,
  );
}
