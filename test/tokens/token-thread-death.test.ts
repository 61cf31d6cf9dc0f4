import { afterEach, describe, expect, it, vi } from 'vitest';
import type * as WorkerThreads from 'node:worker_threads';
import { TokenLedger } from '../../src/tokens/ledger.js';
import type { ModelBundle } from '../../src/tokens/model-bundle.js';
import { TokenPool } from '../../src/tokens/token-pool.js';
import type { TokenTask, TokenTaskResult } from '../../src/tokens/token-tasks.js';
import { createTokenPool, TokenWork } from '../../src/tokens/token-work.js';
import { bashTool } from './fixtures.js';
import { familyDir, familySample, familyToolCall, loadFamily } from './families.js';

// Every Worker the pool starts, recorded so a test can terminate one from outside (the real Worker: a spy, not a fake).
const started = vi.hoisted(() => [] as WorkerThreads.Worker[]);
vi.mock('node:worker_threads', async (importOriginal) => {
  const real = await importOriginal<typeof WorkerThreads>();
  class RecordedWorker extends real.Worker {
    constructor(...args: ConstructorParameters<typeof real.Worker>) {
      super(...args);
      started.push(this);
    }
  }
  return { ...real, Worker: RecordedWorker };
});

let pool: TokenPool<TokenTask, TokenTaskResult> | undefined;
afterEach(async () => {
  await pool?.close();
  pool = undefined;
  started.length = 0;
});

const opening = [{ role: 'user' as const, content: 'List the files.' }];

async function ledgerAfterToolCall(bundle: ModelBundle, work: TokenWork): Promise<TokenLedger> {
  const ledger = await TokenLedger.create({ tokenizer: bundle.tokenizer, template: bundle.template, messages: opening, tools: [bashTool], work });
  ledger.appendSampled(familySample(bundle, familyToolCall(bundle, 'ls'), 'stop'));
  return ledger;
}

describe('a token thread that dies in the middle of a task', () => {
  it('fails the turn whose tokenizing it was in with internal naming the exit, never hangs, and the pool gets its thread back', async () => {
    const bundle = await loadFamily('qwen3');
    pool = new TokenPool<TokenTask, TokenTaskResult>({ script: new URL('../support/exits-mid-render-token-worker.mjs', import.meta.url), size: 2 });
    const work = new TokenWork({ tokenizer: bundle.tokenizer, template: bundle.template, pool, inlineMaxChars: 0 });
    const doomed = await ledgerAfterToolCall(bundle, work);
    const before = doomed.snapshot();
    await expect(doomed.appendEnvironment([{ role: 'tool', name: 'bash', content: 'EXIT-IN-RENDER' }])).rejects.toMatchObject({
      code: 'internal',
      message: expect.stringContaining('token worker exited with code 9'),
    });
    expect(pool.stats()).toMatchObject({ workers: 2, crashes: 1 });
    // Nothing half-appended: the same turn answered again gives what a ledger that never met the crash gives.
    expect(doomed.snapshot()).toEqual(before);
    await doomed.appendEnvironment([{ role: 'tool', name: 'bash', content: 'a.txt' }]);
    const inline = await ledgerAfterToolCall(bundle, TokenWork.inline(bundle.tokenizer, bundle.template));
    await inline.appendEnvironment([{ role: 'tool', name: 'bash', content: 'a.txt' }]);
    expect([...doomed.contextIds()]).toEqual([...inline.contextIds()]);
    await pool.ready();
    expect(pool.stats()).toMatchObject({ workers: 2, busy: 0, queued: 0 });
  });

  it('fails a task whose thread is terminated from outside, runs the queued task on the replacement, and keeps its thread count', async () => {
    const bundle = await loadFamily('qwen3');
    pool = createTokenPool({ dir: familyDir('qwen3') }, { size: 1 });
    const work = new TokenWork({ tokenizer: bundle.tokenizer, template: bundle.template, pool, inlineMaxChars: 0 });
    await pool.ready();
    expect(started).toHaveLength(1);
    // A long prompt keeps the thread rendering and encoding (hundreds of ms) when it is terminated.
    const long = [{ role: 'user' as const, content: 'word '.repeat(200_000) }];
    const running = work.promptIds(long, undefined);
    const queued = work.promptIds(opening, [bashTool]);
    expect(pool.stats()).toMatchObject({ busy: 1, queued: 1 });
    await started[0]!.terminate();
    await expect(running).rejects.toMatchObject({ code: 'internal', message: expect.stringContaining('token worker exited') });
    expect([...(await queued)]).toEqual([...TokenWork.inline(bundle.tokenizer, bundle.template).promptIdsSync(opening, [bashTool])]);
    expect(pool.stats()).toMatchObject({ workers: 1, crashes: 1, busy: 0, queued: 0 });
    expect(started).toHaveLength(2);
  });
});
