// Entry of a token worker thread (see token-pool.ts): the project runs its TypeScript through tsx's loader (no
// build step), and a worker thread started from a process without it (vitest's workers, a plain `node`) needs it
// registered before it can import token-worker.ts.
import { register } from 'tsx/esm/api';

register();
await import('./token-worker.ts');
