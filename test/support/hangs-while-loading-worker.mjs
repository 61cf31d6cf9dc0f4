// TEST DOUBLE: a thread whose start never ends — it neither answers ready nor exits — as one whose module import
// hangs, whose top-level await never settles, or whose tokenizer read is stuck on a hung file system does.
// workerData.hang: 'await' (a top-level await that never settles; an interval keeps the thread's loop alive, as a
// pending read does), 'block' (the thread blocked in a synchronous wait) or 'read' (a synchronous read of
// workerData.path, a FIFO nobody writes: blocked in the kernel, as a read of a hung NFS mount is; terminate() cannot
// end it until the read returns, when the test writes to the FIFO).
// workerData.delayMs instead: a slow start that does end (ready after that long). With workerData.starts (a
// SharedArrayBuffer counting the threads started) and workerData.hangs, only the first `hangs` threads hang; the later
// ones work as test/support/pool-test-worker.mjs. A thread that goes on to start stores 1 at index 1 of `starts` (when
// it has room) just before it loads pool-test-worker.mjs, which answers ready.
import { readFileSync } from 'node:fs';
import { workerData } from 'node:worker_threads';

const { starts, hangs = Infinity, hang = 'await', delayMs } = workerData ?? {};
const started = starts ? Atomics.add(new Int32Array(starts), 0, 1) : 0;
if (delayMs !== undefined) {
  await new Promise((resolve) => setTimeout(resolve, delayMs));
} else if (started < hangs) {
  if (hang === 'read') {
    readFileSync(workerData.path);
  } else if (hang === 'block') {
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0); // nobody ever notifies
  } else {
    setInterval(() => {}, 1 << 30);
    await new Promise(() => {});
  }
}
if (starts && starts.byteLength >= 8) Atomics.store(new Int32Array(starts), 1, 1);
await import('./pool-test-worker.mjs');
