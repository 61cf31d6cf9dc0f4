import cliProgress from 'cli-progress';
import { copyFile, rename } from 'node:fs/promises';
import { resolve } from 'node:path';
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
 * capture it. Ctrl-C stops the build and removes its work dir.
 */
export async function runImageBuild(options: ImageBuildOptions): Promise<number> {
  const packages = options.packages ? options.packages.split(',') : [...DEFAULT_IMAGE_PACKAGES];
  const controller = new AbortController();
  const onSignal = () => controller.abort(new Error('interrupted'));
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
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
      await copyFile(image.path, partial);
      await rename(partial, path);
    }
    process.stdout.write(`${path}\n`);
    return 0;
  } finally {
    progress.stop();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
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
        const payload = { stage: p.stage.padEnd(11), message: p.message.slice(0, 60) };
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
      process.stderr.write(`[image ${((now - t0) / 1000).toFixed(0).padStart(3)} s ${String(Math.round(p.fraction * 100)).padStart(3)}%] ${p.stage}: ${p.message}\n`);
    },
    stop: () => undefined,
  };
}
