// Entry of the worker thread that writes the tiny Qwen3 GGUF (tiny-qwen3.ts ensureTinyQwen3Gguf): the project runs its
// TypeScript through tsx's loader, which a worker thread must register before it can import tiny-qwen3-worker.ts.
import { register } from 'tsx/esm/api';

register();
await import('./tiny-qwen3-worker.ts');
