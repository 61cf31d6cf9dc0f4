// Entry of an answer checker thread (see check-pool.ts): the project runs its TypeScript through tsx's loader (no
// build step), and a worker thread started from a process without it (vitest's workers, a plain `node`) needs it
// registered before it can import check-worker.ts.
import { register } from 'tsx/esm/api';

register();
await import('./check-worker.ts');
