/**
 * Child process of test/thread-priority.test.ts (run as `node --import tsx thread-priority-child.ts MODE`), so that
 * lowering threads never touches the test runner's own. Prints one JSON line: the main thread's nice value and every
 * thread's after the MODE's step.
 * - direct: a worker thread running, one helper thread already at nice 15, then lowerHelperThreads().
 * - worker: lowerHelperThreads() called from a worker thread.
 * - server-on / server-off: a rollout server started with `lowerHelperThreads` true / false (null sandboxes, no
 *   engines), read while it runs.
 */
import { readdirSync } from 'node:fs';
import { setPriority } from 'node:os';
import { Worker } from 'node:worker_threads';
import { startRolloutServer } from '../../src/app.js';
import { silentLogger } from '../../src/observability/logger.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { lowerHelperThreads, niceOfThread } from '../../src/thread-priority.js';

const nices = (): Record<string, number | undefined> => Object.fromEntries(readdirSync('/proc/self/task').map((tid) => [tid, niceOfThread(Number(tid))]));
const mode = process.argv[2];
if (mode === 'direct') {
  const worker = new Worker('setInterval(() => {}, 1000)', { eval: true });
  await new Promise((resolve) => worker.once('online', resolve));
  const helpers = readdirSync('/proc/self/task').map(Number).filter((tid) => tid !== process.pid);
  const alreadyLow = helpers[0]!;
  setPriority(alreadyLow, 15);
  const lowered = lowerHelperThreads();
  console.log(JSON.stringify({ pid: process.pid, alreadyLow, lowered, nices: nices() }));
  await worker.terminate();
} else if (mode === 'worker') {
  // lowerHelperThreads called from a worker thread: what it returned, and every thread's nice value afterwards.
  const code = `const { parentPort } = require('node:worker_threads'); require('tsx/cjs/api').register();
    const { lowerHelperThreads } = require(${JSON.stringify(new URL('../../src/thread-priority.ts', import.meta.url).pathname)});
    parentPort.postMessage(lowerHelperThreads());`;
  const worker = new Worker(code, { eval: true });
  const lowered = await new Promise((resolve, reject) => worker.once('message', resolve).once('error', reject));
  console.log(JSON.stringify({ pid: process.pid, lowered, nices: nices() }));
  await worker.terminate();
} else {
  const server = await startRolloutServer(
    { port: 0, lowerHelperThreads: mode === 'server-on', tokenWorkers: { count: 0 } },
    { logger: silentLogger(), sandboxes: new NullSandboxDriver() },
  );
  console.log(JSON.stringify({ pid: process.pid, nices: nices() }));
  await server.shutdown();
}
