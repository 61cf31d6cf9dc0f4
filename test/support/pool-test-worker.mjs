// TEST DOUBLE worker for test/tokens/token-pool.test.ts and token-pool-faults.test.ts: speaks TokenPool's protocol
// (token-pool.ts) with tasks that echo, throw, exit the thread, name the thread, or block or spin until the test
// releases them (or for good: a thread stuck in a task), so the pool's lifecycle is tested on real threads without
// timing.
import { parentPort, threadId, workerData } from 'node:worker_threads';

if (workerData?.failInit) {
  parentPort.postMessage({ type: 'init-error', message: 'no model here' });
} else {
  parentPort.on('message', ({ id, task }) => {
    switch (task.op) {
      case 'echo':
        return parentPort.postMessage({ type: 'result', id, result: task.value });
      case 'throw':
        return parentPort.postMessage({ type: 'error', id, code: task.code, message: task.message, field: task.field });
      case 'exit':
        return process.exit(task.code);
      case 'thread':
        return parentPort.postMessage({ type: 'result', id, result: threadId });
      case 'spin':
        // Busy (a render in an endless loop) until the test stores 1.
        while (Atomics.load(new Int32Array(task.gate), 0) === 0);
        return parentPort.postMessage({ type: 'result', id, result: 'released' });
      case 'wait':
        // Blocks this thread until the test stores 1 and notifies.
        Atomics.wait(new Int32Array(task.gate), 0, 0);
        return parentPort.postMessage({ type: 'result', id, result: 'released' });
    }
  });
  parentPort.postMessage({ type: 'ready' });
}
