// Stand-in for review-s39-unclosed-pools.test.ts: uses a pool of worker threads (argv[2]: 'check' for the answer
// checker's shared pool, 'token' for a TokenPool with the TEST DOUBLE worker test/support/pool-test-worker.mjs), prints
// the answer, and never closes the pool: the process must still end on its own.
import { sharedCheckPool } from '../../src/environments/math/check-pool.js';
import { TokenPool } from '../../src/tokens/token-pool.js';

if (process.argv[2] === 'check') {
  console.log(JSON.stringify(await sharedCheckPool().check({ kind: 'equivalence', predicted: 'x^2+2x+1', reference: '(x+1)^2' })));
} else {
  const pool = new TokenPool<{ op: 'echo'; value: unknown }, unknown>({ script: new URL('../support/pool-test-worker.mjs', import.meta.url), size: 2 });
  console.log(JSON.stringify(await pool.run({ op: 'echo', value: 'hi' })));
}
