import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ModelBundle } from '../../src/tokens/model-bundle.js';
import type { TokenPool } from '../../src/tokens/token-pool.js';
import type { TokenTask, TokenTaskResult } from '../../src/tokens/token-tasks.js';
import { createTokenPool, TokenWork } from '../../src/tokens/token-work.js';
import { familyDir, loadFamily } from './families.js';

// Concurrent askers for one prompt share one computation (TokenWork.promptIds): one asker giving up must not take
// the others down with it (their samples would end CANCELLED though nobody cancelled them).
describe('a prompt computed once for several askers', () => {
  let bundle: ModelBundle;
  let pool: TokenPool<TokenTask, TokenTaskResult>;
  beforeAll(async () => {
    bundle = await loadFamily('qwen3');
    pool = createTokenPool({ dir: familyDir('qwen3') }, { size: 1 });
    await pool.ready();
  });
  afterAll(async () => pool.close());

  it('still reaches the askers that did not give up when the first one aborts', async () => {
    const work = new TokenWork({ tokenizer: bundle.tokenizer, template: bundle.template, pool, inlineMaxChars: 0 });
    const messages = [{ role: 'user' as const, content: 'Summarize: ' + 'lorem ipsum '.repeat(2_000) }];
    const giveUp = new AbortController();
    const first = work.promptIds(messages, undefined, giveUp.signal);
    const second = work.promptIds(messages, undefined);
    giveUp.abort(new Error('sample cancelled'));
    await expect(first).rejects.toMatchObject({ code: 'cancelled' });
    expect([...(await second)]).toEqual([...TokenWork.inline(bundle.tokenizer, bundle.template).promptIdsSync(messages, undefined)]);
  });

  it('gives up for an asker that aborts while the computation goes on for the others', async () => {
    const work = new TokenWork({ tokenizer: bundle.tokenizer, template: bundle.template, pool, inlineMaxChars: 0 });
    const messages = [{ role: 'user' as const, content: 'Translate: ' + 'dolor sit amet '.repeat(2_000) }];
    const giveUp = new AbortController();
    const staying = work.promptIds(messages, undefined);
    const leaving = work.promptIds(messages, undefined, giveUp.signal);
    giveUp.abort(new Error('sample cancelled'));
    await expect(leaving).rejects.toMatchObject({ code: 'cancelled' });
    expect((await staying).length).toBeGreaterThan(4_000);
  });

  it('stops the computation on its thread once every asker gave up, and a later asker starts afresh', async () => {
    const work = new TokenWork({ tokenizer: bundle.tokenizer, template: bundle.template, pool, inlineMaxChars: 0 });
    const busy = work.promptIds([{ role: 'user', content: 'Busy: ' + 'x y '.repeat(3_000) }], undefined);
    const messages = [{ role: 'user' as const, content: 'Count: ' + 'one two '.repeat(2_000) }];
    const [a, b] = [new AbortController(), new AbortController()];
    const asked = [work.promptIds(messages, undefined, a.signal), work.promptIds(messages, undefined, b.signal)];
    expect(pool.stats().queued).toBe(1);
    a.abort(new Error('first gave up'));
    expect(pool.stats().queued).toBe(1);
    b.abort(new Error('second gave up'));
    // Waiting behind the busy task, it leaves the queue at once.
    expect(pool.stats().queued).toBe(0);
    for (const p of asked) await expect(p).rejects.toMatchObject({ code: 'cancelled' });
    expect([...(await work.promptIds(messages, undefined))]).toEqual([...TokenWork.inline(bundle.tokenizer, bundle.template).promptIdsSync(messages, undefined)]);
    await busy;
  });
});
