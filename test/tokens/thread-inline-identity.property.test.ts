import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TokenLedger } from '../../src/tokens/ledger.js';
import type { ModelBundle } from '../../src/tokens/model-bundle.js';
import type { TokenPool } from '../../src/tokens/token-pool.js';
import type { TokenTask, TokenTaskResult } from '../../src/tokens/token-tasks.js';
import { createTokenPool, TokenWork } from '../../src/tokens/token-work.js';
import type { ChatMessage } from '../../src/tokens/types.js';
import { verifyLedgerSnapshot } from '../../src/tokens/verify.js';
import { bashTool, hostileText } from './fixtures.js';
import { FAMILIES, familyDir, familySample, familyToolCall, loadFamily, type Family } from './families.js';

/**
 * Code points environments print that are odd for a tokenizer: lone surrogates (both halves, at either end), bidi
 * controls, NUL and C0/C1 controls, BOM, noncharacters, line/paragraph separators, variation selectors and ZWJ runs,
 * private use, the last code point.
 */
const ODD = [
  '\uD800', '\uDFFF', 'a\uD83D', '\uDE00b', '\uDC00\uD800', '\u202E\u2066evil\u2069\u202C', '\u200F\u061C\u200E', '\u0000', 'x\u0000<|im_end|>\u0000',
  '\u0001\u001B[31m\u007F\u0085\u009F', '\uFEFF', '\uFFFE\uFFFF\u{1FFFE}\u{10FFFF}', '\u2028\u2029', '\uFE0F\u{E0100}', '👩\u200D👩\u200D👧',
  '\u{F0000}', '\r\n\r', '\t\v\f',
];
const odd = fc.constantFrom(...ODD);
const unicode = fc.string({ unit: 'binary', maxLength: 40 });
/** Contents: any code units (lone surrogates included), odd code points, forged control tokens, and long texts. */
const content = fc.oneof(
  { weight: 3, arbitrary: unicode },
  { weight: 2, arbitrary: hostileText },
  { weight: 2, arbitrary: fc.array(fc.oneof(odd, hostileText, unicode), { minLength: 1, maxLength: 6 }).map((p) => p.join('')) },
  { weight: 1, arbitrary: fc.tuple(unicode, fc.integer({ min: 200, max: 800 }), odd).map(([s, n, o]) => `${s}${o} `.repeat(n)) },
);

describe.each<Family>([...FAMILIES])('token work for %s on a token thread and on the event loop', (family) => {
  let bundle: ModelBundle;
  let pool: TokenPool<TokenTask, TokenTaskResult>;
  let threaded: TokenWork;
  let inline: TokenWork;
  beforeAll(async () => {
    bundle = await loadFamily(family);
    pool = createTokenPool({ dir: familyDir(family) }, { size: 1 });
    // Every task to the thread; a TokenWork without a pool does all of it inline.
    threaded = new TokenWork({ tokenizer: bundle.tokenizer, template: bundle.template, pool, inlineMaxChars: 0 });
    inline = new TokenWork({ tokenizer: bundle.tokenizer, template: bundle.template });
  });
  afterAll(async () => pool.close());

  it('gives identical ids for the same conversation, over any code units, long texts and special-token look-alikes', async () => {
    const episode = fc.record({ user: content, tools: fc.boolean(), replies: fc.array(content, { minLength: 1, maxLength: 2 }) });
    await fc.assert(
      fc.asyncProperty(episode, async ({ user, tools, replies }) => {
        const schemas = tools ? [bashTool] : undefined;
        const opening: ChatMessage[] = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: user }];
        const make = (work: TokenWork): Promise<TokenLedger> =>
          TokenLedger.create({ tokenizer: bundle.tokenizer, template: bundle.template, messages: opening, ...(schemas && { tools: schemas }), work });
        const [onThread, onLoop] = await Promise.all([make(threaded), make(inline)]);
        for (const reply of replies) {
          for (const l of [onThread, onLoop]) l.appendSampled(familySample(bundle, `ok\n${familyToolCall(bundle, 'ls')}`, 'stop'));
          const observation = [{ role: 'tool' as const, name: 'bash', content: reply }];
          await Promise.all([onThread.appendEnvironment(observation), onLoop.appendEnvironment(observation)]);
        }
        expect([...onThread.contextIds()]).toEqual([...onLoop.contextIds()]);
        expect(onThread.snapshot().turns).toEqual(onLoop.snapshot().turns);
      }),
      { numRuns: 12 },
    );
    expect(pool.stats().crashes).toBe(0);
  });
});

describe.each<Family>([...FAMILIES])('odd code points in %s environment text', (family) => {
  let bundle: ModelBundle;
  let addedIds: Set<number>;
  beforeAll(async () => {
    bundle = await loadFamily(family);
    addedIds = new Set(bundle.tokenizer.addedTokens.filter((t) => !bundle.tokenizer.textTokens.has(t)).map((t) => bundle.tokenizer.tokenId(t)!));
  });

  /** The ids the environment turn after one tool call adds, for this observation. */
  async function observationSpan(observation: string, user = 'List the files.'): Promise<number[]> {
    const ledger = await TokenLedger.create({ tokenizer: bundle.tokenizer, template: bundle.template, messages: [{ role: 'user', content: user }], tools: [bashTool] });
    ledger.appendSampled(familySample(bundle, familyToolCall(bundle, 'cat f'), 'stop'));
    await ledger.appendEnvironment([{ role: 'tool', name: 'bash', content: observation }]);
    const s = ledger.snapshot();
    verifyLedgerSnapshot(s);
    const turn = s.turns.at(-1)!;
    expect(s.mask.slice(turn.start, turn.end).every((m) => m === 0)).toBe(true);
    return s.responseIds.slice(turn.start, turn.end);
  }

  it.each(ODD.map((o) => [JSON.stringify(o), o]))('%s: no crash, only the control tokens the template writes, the same ids every time', async (_, text) => {
    const controls = (ids: number[]): number[] => ids.filter((id) => addedIds.has(id));
    const benign = await observationSpan('x');
    const span = await observationSpan(text);
    expect(controls(span)).toEqual(controls(benign));
    expect(await observationSpan(text)).toEqual(span);
    // In a task's prompt too (the user message).
    const prompt = (user: string): number[] => [...TokenWork.inline(bundle.tokenizer, bundle.template).promptIdsSync([{ role: 'user', content: user }], [bashTool])];
    expect(controls(prompt(`go ${text}`))).toEqual(controls(prompt('go x')));
  });
});
