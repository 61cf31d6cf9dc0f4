// TEST DOUBLE: the real token worker (src/tokens/token-worker.ts), except that a task mentioning
// CRASH-THE-TOKEN-WORKER ends the thread (exit code 7) before the worker sees it: a crash in the middle of a sample.
import { register } from 'tsx/esm/api';
import { parentPort } from 'node:worker_threads';

register();
parentPort.on('message', ({ task }) => {
  if (JSON.stringify(task).includes('CRASH-THE-TOKEN-WORKER')) process.exit(7);
});
await import('../../src/tokens/token-worker.ts');
