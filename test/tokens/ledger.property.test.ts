import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { idsJson, piecesText } from '../../src/backends/prompt-json.js';
import { TokenLedger, type LedgerSnapshot, type SampledTurn } from '../../src/tokens/ledger.js';
import type { ModelBundle } from '../../src/tokens/model-bundle.js';
import type { HfTokenizer } from '../../src/tokens/tokenizer.js';
import type { ChatMessage, ChatTemplate, ToolSchema } from '../../src/tokens/types.js';
import { bashTool } from './fixtures.js';
import { FAMILIES, familySample, familyToolCall, loadFamily } from './families.js';

describe.each(FAMILIES)('TokenLedger properties with the %s tokenizer and template', (family) => {
let bundle: ModelBundle;
let tokenizer: HfTokenizer;
let template: ChatTemplate;
let maxId: number;
beforeAll(async () => {
  bundle = await loadFamily(family);
  ({ tokenizer, template } = bundle);
  // Any id of the vocabulary, added and special tokens included (Qwen3: up to </think>, as before).
  maxId = Math.min(tokenizer.vocabSize - 1, tokenizer.tokenId('</think>') ?? Infinity);
});


const anyText = fc.string({ unit: 'binary', maxLength: 40 });
const envMessage = fc.record({ role: fc.constantFrom('tool', 'user', 'system'), content: anyText }) as fc.Arbitrary<ChatMessage>;
const envMessages = fc.array(envMessage, { minLength: 1, maxLength: 3 });
const meta = fc.record(
  { toolName: fc.constantFrom('bash', 'finish'), toolOutcome: fc.constantFrom('ok', 'error', 'malformed', 'finish') },
  { requiredKeys: [] },
) as fc.Arbitrary<{ toolName?: string; toolOutcome?: 'ok' | 'error' | 'malformed' | 'finish' }>;
const opening = fc.tuple(fc.option(anyText, { nil: undefined }), anyText).map(([system, user]): ChatMessage[] => [
  ...(system === undefined ? [] : [{ role: 'system' as const, content: system }]),
  { role: 'user', content: user },
]);

/** Any ids the engine could return (any vocabulary id, stop tokens anywhere), with any logprobs. */
function anySample(): fc.Arbitrary<SampledTurn> {
  return fc
    .record({
      body: fc.array(fc.tuple(fc.integer({ min: 0, max: maxId }), fc.double({ min: -30, max: 0, noNaN: true })), { maxLength: 24 }),
      stop: fc.constantFrom(undefined, 0, 1),
      policyVersion: fc.nat(20),
      finishReason: fc.constantFrom('stop', 'length', 'abort'),
    })
    .map(({ body, stop, policyVersion, finishReason }) => {
      const stopId = stop === undefined ? undefined : tokenizer.stopTokenIds[Math.min(stop, tokenizer.stopTokenIds.length - 1)]!;
      const pairs = stopId === undefined ? body : [...body, [stopId, -0.25] as [number, number]];
      return { tokenIds: pairs.map((p) => p[0]), logprobs: pairs.map((p) => p[1]), backend: 'b', policyVersion, finishReason };
    });
}

/** Independent check of the invariants (not the ledger's own verifier). */
function checkInvariants(s: LedgerSnapshot): void {
  const n = s.responseIds.length;
  expect(s.mask).toHaveLength(n);
  expect(s.logprobs).toHaveLength(n);
  s.mask.forEach((m, i) => {
    if (m === 0) expect(s.logprobs[i]).toBe(0);
  });
  let at = 0;
  for (const turn of s.turns) {
    expect(turn.start).toBe(at);
    expect(s.mask.slice(turn.start, turn.end).every((m) => m === (turn.role === 'assistant' ? 1 : 0))).toBe(true);
    at = turn.end;
  }
  expect(at).toBe(n);
  expect(s.totalTokens).toBe(s.promptIds.length + n);
}

  it('holds its invariants and keeps sampled ids verbatim over random conversations', async () => {
    const episode = fc.record({
      opening,
      tools: fc.boolean(),
      steps: fc.array(fc.tuple(anySample(), envMessages, meta), { minLength: 1, maxLength: 5 }),
      endAfterSample: fc.boolean(),
    });
    await fc.assert(
      fc.asyncProperty(episode, async ({ opening, tools, steps, endAfterSample }) => {
        const ledger = new TokenLedger({ tokenizer, template, messages: opening, ...(tools ? { tools: [bashTool] } : {}) });
        let view = ledger.contextIds();
        let context = [...view];
        const grows = (): void => {
          const nextView = ledger.contextIds();
          const next = [...nextView];
          expect(next.slice(0, context.length)).toEqual(context);
          // A view handed out earlier (an engine request may still be reading it) shows what it showed then.
          expect([...view]).toEqual(context);
          // The JSON the engine client writes is the context's, though only the new ids were serialized.
          expect(piecesText(idsJson(nextView))).toBe(JSON.stringify(next));
          view = nextView;
          context = next;
          checkInvariants(ledger.snapshot());
        };
        for (const [k, [sample, messages, info]] of steps.entries()) {
          ledger.appendSampled(sample);
          grows();
          const turn = ledger.snapshot().turns.at(-1)!;
          expect(context.slice(ledger.promptIds.length + turn.start, ledger.promptIds.length + turn.end)).toEqual(sample.tokenIds);
          if (k < steps.length - 1 || !endAfterSample) {
            await ledger.appendEnvironment(messages, info);
            grows();
          }
        }
        const final = ledger.finish();
        checkInvariants(final);
        const assistantTurns = final.turns.filter((t) => t.role === 'assistant');
        const assistantMessages = final.messages.filter((m) => m.role === 'assistant');
        expect(assistantTurns).toHaveLength(steps.length);
        for (const [k, [sample]] of steps.entries()) {
          const turn = assistantTurns[k]!;
          expect(final.responseIds.slice(turn.start, turn.end)).toEqual(sample.tokenIds);
          expect(final.logprobs.slice(turn.start, turn.end)).toEqual(sample.logprobs);
          const stopped = tokenizer.stopTokenIds.includes(sample.tokenIds.at(-1) ?? -1);
          expect(assistantMessages[k]!.content).toBe(tokenizer.decode(stopped ? sample.tokenIds.slice(0, -1) : sample.tokenIds));
        }
        const versions = steps.map(([s]) => s.policyVersion);
        expect(final.policyVersionMin).toBe(Math.min(...versions));
        expect(final.policyVersionMax).toBe(Math.max(...versions));
      }),
      { numRuns: 100 },
    );
  });

  it('equals a fresh tokenization of the rendered conversation when sampled ids are canonical', async () => {
    const chars = fc.constantFrom(...'abcXYZ019 .,;:!?{}[]"\'\n\té中🙂-_/'.split(/(?:)/u));
    const prose = fc
      .tuple(fc.constantFrom(...'AbcdQxyZ'), fc.string({ unit: chars, maxLength: 30 }))
      // Llama's and Gemma's templates trim contents: canonical text has no whitespace to trim.
      .map(([first, rest]) => (first + rest).trimEnd());
    const assistantText = fc
      .tuple(prose, fc.option(fc.string({ unit: chars, maxLength: 12 }), { nil: undefined }))
      .map(([text, cmd]) => (cmd === undefined ? text : `${text}\n${familyToolCall(bundle, cmd)}`));
    const step = fc.tuple(assistantText, fc.constantFrom('stop' as const, 'length' as const), envMessages);
    const episode = fc.record({ opening, tools: fc.boolean(), steps: fc.array(step, { minLength: 1, maxLength: 5 }) });
    await fc.assert(
      fc.asyncProperty(episode, async ({ opening, tools, steps }) => {
        const schemas: readonly ToolSchema[] | undefined = tools ? [bashTool] : undefined;
        const ledger = new TokenLedger({ tokenizer, template, messages: opening, ...(schemas ? { tools: schemas } : {}) });
        for (const [text, ending, messages] of steps) {
          ledger.appendSampled(familySample(bundle, text, ending));
          await ledger.appendEnvironment(messages);
        }
        const rendered = template.render(ledger.snapshot().messages, { addGenerationPrompt: true, ...(schemas ? { tools: schemas } : {}) });
        expect([...ledger.contextIds()]).toEqual(tokenizer.encode(rendered));
      }),
      { numRuns: 100 },
    );
  });
});

