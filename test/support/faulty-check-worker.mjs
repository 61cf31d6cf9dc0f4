// TEST DOUBLE: the real answer checker thread (src/environments/math/check-worker.ts) with faults on cue, seen before
// the real worker sees the task: an answer "SPIN-FOREVER" loops for good (a checker bug no bound of the checker's own
// stops), "BLOCK-FOREVER" blocks the thread for good without using CPU (as one starved of a core), "EXIT-THE-CHECKER"
// ends the thread (exit code 7).
import { register } from 'tsx/esm/api';
import { parentPort } from 'node:worker_threads';

register();
parentPort.on('message', ({ task }) => {
  const text = JSON.stringify(task);
  if (text.includes('EXIT-THE-CHECKER')) process.exit(7);
  if (text.includes('SPIN-FOREVER')) for (;;) {}
  if (text.includes('BLOCK-FOREVER')) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);
});
await import('../../src/environments/math/check-worker.ts');
