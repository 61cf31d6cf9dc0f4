import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { TokenLedger, type SampledTurn } from '../../src/tokens/ledger.js';
import type { ModelBundle } from '../../src/tokens/model-bundle.js';
import type { TextPart, Tokenizer } from '../../src/tokens/types.js';
import { verifyLedgerSnapshot } from '../../src/tokens/verify.js';
import { bashTool } from './fixtures.js';
import { FAMILIES, familyToolCall, loadFamily, type Family } from './families.js';

/** The family's tokenizer, recording every text it is asked to encode (a spy: the real tokenizer does the work). */
function recordingTokenizer(real: Tokenizer): Tokenizer & { encoded: string[] } {
  const spy = Object.create(real) as Tokenizer & { encoded: string[] };
  spy.encoded = [];
  spy.encode = (text: string) => (spy.encoded.push(text), real.encode(text));
  spy.encodeParts = (parts: readonly TextPart[]) => (spy.encoded.push(parts.map((p) => p.text).join('')), real.encodeParts(parts));
  return spy;
}

/** A word no template or tool output writes: seeing it in an encoded text means sampled text was re-tokenized. */
const MARK = 'Qzxv';

// A turn sampled in segments (each request aborted by a pause in ABORT mode, then asked again, possibly by a newer
// policy) must keep what each engine answered: ids not the canonical tokenization, cuts inside a multi-byte character.
describe.each<Family>([...FAMILIES])('a %s turn sampled across aborted requests by several policy versions', (family) => {
  let bundle: ModelBundle;
  beforeAll(async () => {
    bundle = await loadFamily(family);
  });

  it('keeps every segment\'s ids, logprobs and versions exactly, and never tokenizes the sampled text again', async () => {
    const chars = fc.constantFrom(...'ab Z09.\n{}"中文🙂𓀀é—'.split(/(?:)/u));
    const turn = fc.record({
      text: fc.string({ unit: chars, minLength: 1, maxLength: 20 }),
      // Per-character ids (not what the tokenizer would give the whole text), or the canonical ones.
      perChar: fc.boolean(),
      stop: fc.boolean(),
      cuts: fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { maxLength: 4 }),
      versionSteps: fc.array(fc.nat(3), { minLength: 5, maxLength: 5 }),
    });
    await fc.assert(
      fc.asyncProperty(fc.array(turn, { minLength: 1, maxLength: 3 }), async (turns) => {
        const tokenizer = recordingTokenizer(bundle.tokenizer);
        const ledger = await TokenLedger.create({ tokenizer, template: bundle.template, messages: [{ role: 'user', content: 'Go.' }], tools: [bashTool] });
        const promptEncodes = tokenizer.encoded.length;
        const expected: { ids: number[]; logprobs: number[]; version: number; versionStart: number; finish: SampledTurn['finishReason'] }[] = [];
        let version = 1;
        let lp = 0;
        for (const t of turns) {
          const text = `${MARK} ${t.text}\n${familyToolCall(bundle, 'ls')}`;
          const ids = t.perChar ? [...text].flatMap((c) => bundle.tokenizer.encode(c)) : bundle.tokenizer.encode(text);
          if (t.stop) ids.push(bundle.tokenizer.stopTokenIds[0]!);
          const cuts = [...new Set(t.cuts.map((c) => Math.floor(c * ids.length)))].filter((p) => p > 0 && p < ids.length).sort((a, b) => a - b);
          const bounds = [0, ...cuts, ids.length];
          for (let k = 0; k + 1 < bounds.length; k++) {
            const segment = ids.slice(bounds[k], bounds[k + 1]);
            const versionStart = version;
            version += t.versionSteps[k]!;
            const logprobs = segment.map(() => -(++lp) / 1024);
            const finish: SampledTurn['finishReason'] = k + 2 < bounds.length ? 'abort' : t.stop ? 'stop' : 'length';
            ledger.appendSampled({ tokenIds: segment, logprobs, backend: `engine-v${version}`, policyVersion: version, policyVersionStart: versionStart, finishReason: finish });
            expected.push({ ids: segment, logprobs, version, versionStart, finish });
          }
          await ledger.appendEnvironment([{ role: 'tool', name: 'bash', content: 'a.txt' }]);
        }
        const s = ledger.finish();
        verifyLedgerSnapshot(s);
        const spans = s.turns.filter((x) => x.role === 'assistant');
        expect(spans).toHaveLength(expected.length);
        for (const [k, span] of spans.entries()) {
          const e = expected[k]!;
          expect(s.responseIds.slice(span.start, span.end)).toEqual(e.ids);
          expect(s.logprobs.slice(span.start, span.end)).toEqual(e.logprobs);
          expect(s.mask.slice(span.start, span.end).every((m) => m === 1)).toBe(true);
          expect([span.policyVersionStart, span.policyVersion, span.finishReason]).toEqual([e.versionStart, e.version, e.finish]);
        }
        // Every other token is the template's or the environment's: mask 0, logprob 0.
        const sampled = spans.reduce((n, x) => n + x.end - x.start, 0);
        expect(s.mask.filter((m) => m === 1)).toHaveLength(sampled);
        expect([...ledger.contextIds()]).toEqual([...s.promptIds, ...s.responseIds]);
        // The environment's turns were encoded through the spy, none of them with sampled text.
        expect(tokenizer.encoded.length).toBeGreaterThan(promptEncodes);
        expect(tokenizer.encoded.slice(promptEncodes).filter((text) => text.includes(MARK))).toEqual([]);
      }),
      { numRuns: 25 },
    );
  });
});
