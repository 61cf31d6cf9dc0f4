import { readlinkSync } from 'node:fs';
import { parentPort } from 'node:worker_threads';
import { lowerThisThread, threadStat } from '../../thread-priority.js';
import type { CheckWorkerReply } from './check-pool.js';
import { runCheckTask, type CheckTask } from './check-tasks.js';

/**
 * An answer checker thread (started by CheckPool through check-worker-entry.mjs): runs checks (check-tasks.ts) one at
 * a time and says, with every answer, how much CPU time it has used (Linux), so the pool can tell a check past its
 * CPU bound from a thread that is only waiting for a core. A check that throws is a checker bug, answered as an error.
 */
const port = parentPort;
if (!port) throw new Error('check-worker.ts runs in a worker thread (see check-pool.ts)');

// Below the event loop's priority: the thread serving gRPC and the engines gets a core first (src/thread-priority.ts).
lowerThisThread();

/** This thread's Linux id ("/proc/thread-self" → "<pid>/task/<tid>"), undefined elsewhere. */
function ownTid(): number | undefined {
  if (process.platform !== 'linux') return undefined;
  try {
    const tid = Number(readlinkSync('/proc/thread-self').split('/').at(-1));
    return Number.isInteger(tid) && tid > 0 ? tid : undefined;
  } catch {
    return undefined;
  }
}

const tid = ownTid();

/** utime + stime of this thread, in ticks. */
function cpuTicks(): number | undefined {
  const stat = tid === undefined ? undefined : threadStat(tid);
  return stat === undefined ? undefined : Number(stat[11]) + Number(stat[12]);
}

port.on('message', ({ id, task }: { id: number; task: CheckTask }) => {
  let reply: CheckWorkerReply;
  try {
    reply = { type: 'result', id, result: runCheckTask(task) };
  } catch (err) {
    reply = { type: 'error', id, message: err instanceof Error ? err.message : String(err) };
  }
  const ticks = cpuTicks();
  port.postMessage(ticks === undefined ? reply : { ...reply, cpuTicks: ticks });
});
port.postMessage({ type: 'ready', ...(tid !== undefined && { tid }), ...(cpuTicks() !== undefined && { cpuTicks: cpuTicks() }) } satisfies CheckWorkerReply);
