import { parentPort, workerData } from 'node:worker_threads';
import { writeTinyQwen3Gguf, type TinyQwen3Shape } from './tiny-qwen3.js';

/**
 * Worker thread body: writes the tiny Qwen3 GGUF at `workerData.path`. Generating ~19 MB of seeded weights and writing
 * them takes about a second of CPU, which on the server's thread would stall every stream and timer meanwhile.
 */
const { path, shape } = workerData as { path: string; shape: TinyQwen3Shape };
writeTinyQwen3Gguf(path, shape);
parentPort!.postMessage('written');
