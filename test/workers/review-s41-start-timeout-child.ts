// Stand-in for review-s41-start-timeout.test.ts: a TokenPool whose one thread never starts (TEST DOUBLE
// test/support/hangs-while-loading-worker.mjs) with the default start timeout (a minute); one task, given up after
// 200 ms, and the pool is never closed: the process must still end at once, not when the start timer fires.
import { TokenPool } from '../../src/tokens/token-pool.js';

const pool = new TokenPool<{ op: 'echo'; value: unknown }, unknown>({
  script: new URL('../support/hangs-while-loading-worker.mjs', import.meta.url),
  workerData: { hang: process.argv[2] ?? 'await' },
  size: 1,
});
await pool.run({ op: 'echo', value: 'hi' }, AbortSignal.timeout(200)).catch((err: Error) => console.log(JSON.stringify(err.message)));
