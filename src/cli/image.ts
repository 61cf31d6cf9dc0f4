import cliProgress from 'cli-progress';
import { forTerminalLine } from './terminal-text.js';
import { ignoreGoneTerminal, StopSignals } from './stop-signals.js';
import { mkdirSync, statSync } from 'node:fs';
import { copyFile, rename, rm } from 'node:fs/promises';
import { resolve } from 'node:path';
import { RolloutError } from '../errors.js';
import { buildImage, type BuildProgress } from '../sandboxes/images/build-image.js';
import { DEFAULT_IMAGE_PACKAGES } from '../sandboxes/images/image-recipe.js';

export interface ImageBuildOptions {
  /** Comma-separated Debian packages; default the project's default image (python3, bash, coreutils). */
  packages?: string;
  suite?: string;
  cacheDir?: string;
  mirror?: string;
  /** Also copy the image here. */
  out?: string;
}

/**
 * `rollout image build`: builds (or finds in the cache) a .sif from Debian packages, showing progress on stderr
 * (a bar on a terminal, one line per step otherwise) and printing the image's path on stdout, so scripts can
 * capture it. Ctrl-C (SIGTERM, a hang-up) stops the build and removes its work dir: exit 130 (143, 129).
 */
export async function runImageBuild(options: ImageBuildOptions): Promise<number> {
  const packages = options.packages ? options.packages.split(',') : [...DEFAULT_IMAGE_PACKAGES];
  // Not created here: a cached image is returned to anyone, and a build as non-root is refused for what it is (root).
  if (options.cacheDir !== undefined) refuseNonDirectory('--cache-dir', options.cacheDir);
  if (options.out !== undefined && isDirectory(options.out)) throw imageNotWritten(options.out, 'it is a directory');
  ignoreGoneTerminal();
  const controller = new AbortController();
  const signals = new StopSignals((name) => controller.abort(new Error(`interrupted (${name})`)));
  const progress = startBuildProgress();
  const started = performance.now();
  try {
    const image = await buildImage({ packages, suite: options.suite, cacheDir: options.cacheDir, mirror: options.mirror, signal: controller.signal, onProgress: progress.update });
    progress.stop();
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    process.stderr.write(image.cached ? `image ${image.hash} is cached\n` : `built image ${image.hash} in ${seconds} s\n`);
    let path = image.path;
    if (options.out) {
      path = resolve(options.out);
      const partial = `${path}.partial-${process.pid}`;
      try {
        await copyFile(image.path, partial);
        await rename(partial, path);
      } catch (err) {
        await rm(partial, { force: true });
        throw imageNotWritten(options.out, (err as Error).message.split(',')[0]!);
      }
    }
    process.stdout.write(`${path}\n`);
    return 0;
  } catch (err) {
    if (signals.exitCode === undefined) throw err;
    progress.stop();
    process.stderr.write(`image build: ${signals.signal}: stopped, its work dir removed\n`);
    return signals.exitCode;
  } finally {
    progress.stop();
    signals.dispose();
  }
}

function startBuildProgress(): { update: (p: BuildProgress) => void; stop: () => void } {
  let stopped = false;
  if (process.stderr.isTTY) {
    const bar = new cliProgress.SingleBar(
      { format: '{stage} {bar} {percentage}% | {duration_formatted} | {message}', stream: process.stderr, hideCursor: true, clearOnComplete: false },
      cliProgress.Presets.shades_classic,
    );
    let started = false;
    return {
      update: (p) => {
        const payload = { stage: p.stage.padEnd(11), message: forTerminalLine(p.message).slice(0, 60) };
        if (!started) bar.start(100, 0, payload);
        started = true;
        bar.update(Math.round(p.fraction * 100), payload);
      },
      stop: () => {
        if (started && !stopped) bar.stop();
        stopped = true;
      },
    };
  }
  // Not a terminal (CI logs): one line per stage, and at most one line every 5 s within a stage.
  const t0 = performance.now();
  let stage = '';
  let last = 0;
  return {
    update: (p) => {
      const now = performance.now();
      if (p.stage === stage && now - last < 5_000 && p.fraction < 1) return;
      stage = p.stage;
      last = now;
      process.stderr.write(`[image ${((now - t0) / 1000).toFixed(0).padStart(3)} s ${String(Math.round(p.fraction * 100)).padStart(3)}%] ${p.stage}: ${forTerminalLine(p.message)}\n`);
    },
    stop: () => undefined,
  };
}

function imageNotWritten(out: string, why: string): RolloutError {
  return new RolloutError('invalid_argument', `--out ${out}: cannot write the image there: ${why}`);
}

/**
 * Invalid_argument naming `flag` when something other than a directory is at `dir`; nothing there, or nothing this
 * user may see, is left to what comes next (mkdir, or the build's own checks).
 */
function refuseNonDirectory(flag: string, dir: string): void {
  let stats;
  try {
    stats = statSync(dir);
  } catch {
    return;
  }
  if (!stats.isDirectory()) throw new RolloutError('invalid_argument', `${flag} ${dir}: cannot be used as a directory (it is a file)`);
}

function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

/**
 * Creates `dir` (given by `flag`) when missing; invalid_argument naming the flag when it cannot be a directory (a
 * file there, no permission), instead of an fs error from deep inside the build.
 */
export function usableDirectory(flag: string, dir: string): void {
  refuseNonDirectory(flag, dir);
  try {
    mkdirSync(dir, { recursive: true });
  } catch (err) {
    throw new RolloutError('invalid_argument', `${flag} ${dir}: cannot be used as a directory (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
  }
}
