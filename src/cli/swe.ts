import { createLogger } from '../observability/logger.js';
import { buildTaskImage } from '../environments/swe/pypi-tasks/build-task-image.js';
import { loadSweTasks } from '../environments/swe/pypi-tasks/task-definition.js';
import { RolloutError } from '../errors.js';
import { usableDirectory } from './image.js';
import { ignoreGoneTerminal, StopSignals } from './stop-signals.js';

export interface SweBuildOptions {
  /** Task ids to build (default: every task under tasks/swe). */
  task?: string[];
  /** sdists and task images (default: .cache/swe in the project). */
  cacheDir?: string;
}

/**
 * `rollout swe build`: builds (or finds cached) the image of each SWE task defined under tasks/swe — the base image
 * from Debian packages, the sdist from PyPI, the release with its fix reverted at /testbed — logging progress on
 * stderr and printing `<task id>\t<image path>` per task on stdout. Ctrl-C (SIGTERM, a hang-up) stops the build and
 * removes its work dir: exit 130 (143, 129).
 */
export async function runSweBuild(options: SweBuildOptions): Promise<number> {
  if (options.cacheDir !== undefined) usableDirectory('--cache-dir', options.cacheDir);
  ignoreGoneTerminal();
  const controller = new AbortController();
  const signals = new StopSignals((name) => controller.abort(new Error(`interrupted (${name})`)));
  const logger = createLogger({ level: 'info', destination: process.stderr });
  try {
    const all = await loadSweTasks();
    const wanted = options.task?.length ? options.task : all.map((t) => t.id);
    for (const id of wanted) {
      const task = all.find((t) => t.id === id);
      if (!task) throw RolloutError.invalid('task', `unknown SWE task "${id}"; known: ${all.map((t) => t.id).join(', ')}`);
      const started = performance.now();
      const image = await buildTaskImage(task, { cacheDir: options.cacheDir, signal: controller.signal, logger });
      logger.info({ task: id, cached: image.cached, seconds: Number(((performance.now() - started) / 1000).toFixed(1)) }, image.cached ? 'image cached' : 'image built');
      process.stdout.write(`${id}\t${image.path}\n`);
    }
    return 0;
  } catch (err) {
    if (signals.exitCode === undefined) throw err;
    logger.warn({ signal: signals.signal }, 'swe build: stopped, its work dir removed');
    return signals.exitCode;
  } finally {
    signals.dispose();
  }
}
