// TEST DOUBLE: a token thread that dies while loading (exit code 3 before it answers ready), as one running out of
// memory on a model folder does. With workerData.starts (a SharedArrayBuffer counting the threads started) and
// workerData.deaths, only the first `deaths` threads die; the later ones work as test/support/pool-test-worker.mjs.
import { workerData } from 'node:worker_threads';

const { starts, deaths = Infinity } = workerData ?? {};
const started = starts ? Atomics.add(new Int32Array(starts), 0, 1) : 0;
if (started < deaths) process.exit(3);
await import('./pool-test-worker.mjs');
