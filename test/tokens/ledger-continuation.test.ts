import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { TokenLedger, type LedgerSnapshot, type SampledTurn } from '../../src/tokens/ledger.js';
import { loadQwen3, type HfTokenizer } from '../../src/tokens/tokenizer.js';
import type { ChatMessage, ChatTemplate } from '../../src/tokens/types.js';
import { verifyLedgerSnapshot } from '../../src/tokens/verify.js';
import { bashTool, toolCallText } from './fixtures.js';

// An assistant turn whose request was aborted (PauseGeneration ABORT, a weight update) and asked again for the
// rest: the ledger keeps each segment as its own span (mask 1, its logprobs, the version that sampled it), marks
// the later ones as continuing the turn, and builds the message from all the turn's ids decoded together.

let tokenizer: HfTokenizer;
let template: ChatTemplate;
let imEnd: number;
beforeAll(async () => {
  ({ tokenizer, template } = await loadQwen3());
  imEnd = tokenizer.tokenId('<|im_end|>')!;
});

const opening: ChatMessage[] = [
  { role: 'system', content: 'You are an agent.' },
  { role: 'user', content: 'List the files.' },
];

const newLedger = (): TokenLedger => new TokenLedger({ tokenizer, template, messages: opening, tools: [bashTool] });

function segment(ids: readonly number[], finishReason: SampledTurn['finishReason'], policyVersion: number, policyVersionStart = policyVersion, from = 0): SampledTurn {
  return { tokenIds: ids, logprobs: ids.map((_, i) => -0.001 * (from + i + 1)), backend: `engine-v${policyVersion}`, policyVersion, policyVersionStart, finishReason };
}

/** The turn's ids cut at `cuts` (sorted positions inside), all segments but the last ending "abort". */
function split(ids: readonly number[], cuts: readonly number[], last: SampledTurn['finishReason'], versions: (k: number) => number): SampledTurn[] {
  const bounds = [0, ...cuts, ids.length];
  return bounds.slice(0, -1).map((start, k) => segment(ids.slice(start, bounds[k + 1]), k === bounds.length - 2 ? last : 'abort', versions(k), versions(k), start));
}

const retokenized = (ledger: TokenLedger): number[] =>
  tokenizer.encode(template.render(ledger.snapshot().messages, { addGenerationPrompt: true, tools: [bashTool] }));

describe('TokenLedger: a turn continued after an aborted request', () => {
  it('records each segment as its own span, the later ones continuing the turn, and one message decoded from all of them', async () => {
    const text = `Let me look.\n${toolCallText('ls -la')}`;
    const ids = [...tokenizer.encode(text), imEnd];
    const ledger = newLedger();
    const cut = 5;
    const first = ledger.appendSampled(segment(ids.slice(0, cut), 'abort', 3));
    expect(first).toBe(tokenizer.decode(ids.slice(0, cut)));
    expect([...ledger.contextIds()].slice(ledger.promptIds.length)).toEqual(ids.slice(0, cut));
    const whole = ledger.appendSampled(segment(ids.slice(cut), 'stop', 4, 4, cut));
    expect(whole).toBe(text);
    await ledger.appendEnvironment([{ role: 'tool', content: 'a b c', name: 'bash' }], { toolName: 'bash', toolOutcome: 'ok' });
    const s = ledger.snapshot();
    expect(s.turns.slice(0, 2)).toEqual([
      { role: 'assistant', start: 0, end: cut, backend: 'engine-v3', policyVersion: 3, policyVersionStart: 3, finishReason: 'abort' },
      { role: 'assistant', start: cut, end: ids.length, backend: 'engine-v4', policyVersion: 4, policyVersionStart: 4, finishReason: 'stop', continuesTurn: true },
    ]);
    expect(s.responseIds.slice(0, ids.length)).toEqual(ids);
    expect(s.mask.slice(0, ids.length).every((m) => m === 1)).toBe(true);
    expect(s.logprobs.slice(0, ids.length)).toEqual(ids.map((_, i) => -0.001 * (i + 1)));
    expect(s.messages.filter((m) => m.role === 'assistant')).toEqual([{ role: 'assistant', content: text }]);
    expect(s).toMatchObject({ policyVersionMin: 3, policyVersionMax: 4 });
    // The context is the conversation as the template renders it: the cut left no trace.
    expect([...ledger.contextIds()]).toEqual(retokenized(ledger));
  });

  it('decodes a character whose bytes straddle the cut whole, never as two replacement characters', () => {
    const text = '答案是🫠，龘也行。';
    const ids = [...tokenizer.encode(text), imEnd];
    // A cut between two tokens of one character: the prefix alone decodes to a replacement character.
    const cut = ids.findIndex((_, i) => i > 0 && tokenizer.decode(ids.slice(0, i)).endsWith('\uFFFD'));
    expect(cut, 'a token boundary inside a character').toBeGreaterThan(0);
    const ledger = newLedger();
    ledger.appendSampled(segment(ids.slice(0, cut), 'abort', 1));
    const content = ledger.appendSampled(segment(ids.slice(cut), 'stop', 2, 2, cut));
    expect(content).toBe(text);
    expect(content).not.toContain('\uFFFD');
    expect(ledger.snapshot().messages.at(-1)).toEqual({ role: 'assistant', content: text });
  });

  it('a KEEP pause across an update: one span with two versions, both in the trajectory min/max', () => {
    const ledger = newLedger();
    ledger.appendSampled(segment([...tokenizer.encode('Done.'), imEnd], 'stop', 6, 5));
    const s = ledger.finish();
    expect(s.turns[0]).toMatchObject({ policyVersionStart: 5, policyVersion: 6 });
    expect(s).toMatchObject({ policyVersionMin: 5, policyVersionMax: 6 });
  });

  it('only an aborted span can be continued: after a finished one, a second completion is failed_precondition', () => {
    const ledger = newLedger();
    ledger.appendSampled(segment(tokenizer.encode('cut'), 'length', 1));
    expect(() => ledger.appendSampled(segment(tokenizer.encode('more'), 'stop', 1))).toThrow(expect.objectContaining({ code: 'failed_precondition' }));
  });

  it('an aborted span may also end the turn: the environment answers it like any other', async () => {
    const ledger = newLedger();
    ledger.appendSampled(segment(tokenizer.encode('All of the budget'), 'abort', 1));
    await ledger.appendEnvironment([{ role: 'user', content: 'go on' }]);
    ledger.appendSampled(segment([...tokenizer.encode('ok'), imEnd], 'stop', 2));
    const s = ledger.finish();
    expect(s.turns.map((t) => [t.role, t.continuesTurn ?? false])).toEqual([['assistant', false], ['user', false], ['assistant', false]]);
    expect([...ledger.contextIds()]).toEqual([...s.promptIds, ...s.responseIds]);
  });
});

describe('verifyLedgerSnapshot: consecutive assistant spans', () => {
  const base = (): LedgerSnapshot => ({
    promptIds: [1],
    responseIds: [5, 6, 7, 8],
    mask: [1, 1, 1, 1],
    logprobs: [-1, -1, -1, -1],
    turns: [
      { role: 'assistant', start: 0, end: 2, policyVersion: 1, policyVersionStart: 1, finishReason: 'abort' },
      { role: 'assistant', start: 2, end: 4, policyVersion: 2, policyVersionStart: 2, finishReason: 'stop', continuesTurn: true },
    ],
    messages: [],
    policyVersionMin: 1,
    policyVersionMax: 2,
    totalTokens: 5,
  });

  it('accepts a continuation of an aborted span', () => {
    expect(() => verifyLedgerSnapshot(base())).not.toThrow();
  });

  it.each([
    ['a second span not marked as continuing', (s: LedgerSnapshot) => delete s.turns[1]!.continuesTurn, /follows assistant turn 0 without continuing/],
    ['a continuation of a span that was not aborted', (s: LedgerSnapshot) => (s.turns[0]!.finishReason = 'length'), /follows assistant turn 0 without continuing/],
    ['a first span marked as continuing', (s: LedgerSnapshot) => (s.turns[0]!.continuesTurn = true), /continues a turn but does not follow an assistant turn/],
    ['a version outside min/max', (s: LedgerSnapshot) => (s.turns[1]!.policyVersionStart = 0), /policy version 0 outside \[1, 2\]/],
  ])('refuses %s', (_name, mutate, message) => {
    const s = base();
    mutate(s);
    expect(() => verifyLedgerSnapshot(s)).toThrow(message);
  });
});

describe('TokenLedger continuation properties', () => {
  const chars = fc.constantFrom(...'abcXYZ019 .,;:!?{}"\n中文🙂🫠龘𓀀é—'.split(/(?:)/u));
  const text = fc.tuple(fc.constantFrom(...'AbQx中🙂'.split(/(?:)/u)), fc.string({ unit: chars, maxLength: 40 })).map(([a, b]) => (a + b).trimEnd());

  it('cutting a turn anywhere into segments changes nothing but the spans: same ids, logprobs, message and next context', async () => {
    const turn = fc.record({ text, ending: fc.constantFrom('stop' as const, 'length' as const), cuts: fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { maxLength: 3 }) });
    await fc.assert(
      fc.asyncProperty(fc.array(turn, { minLength: 1, maxLength: 3 }), fc.nat(5), async (turns, firstVersion) => {
        const whole = newLedger();
        const cut = newLedger();
        let version = firstVersion;
        for (const t of turns) {
          const ids = [...tokenizer.encode(t.text), ...(t.ending === 'stop' ? [imEnd] : [])];
          const positions = [...new Set(t.cuts.map((c) => Math.floor(c * ids.length)))].filter((p) => p > 0 && p < ids.length).sort((a, b) => a - b);
          const segments = split(ids, positions, t.ending, (k) => version + k);
          const expected = whole.appendSampled({ ...segment(ids, t.ending, version), policyVersion: version + segments.length - 1 });
          let content = '';
          for (const s of segments) content = cut.appendSampled(s);
          expect(content).toBe(expected);
          version += segments.length - 1;
          for (const l of [whole, cut]) await l.appendEnvironment([{ role: 'user', content: 'next' }]);
        }
        const a = whole.finish();
        const b = cut.finish();
        expect(b.responseIds).toEqual(a.responseIds);
        expect(b.mask).toEqual(a.mask);
        expect(b.logprobs).toEqual(a.logprobs);
        expect(b.messages).toEqual(a.messages);
        expect([...cut.contextIds()]).toEqual([...whole.contextIds()]);
        // Spans: each segment its own assistant span, the later ones continuing; together they cover the turn.
        const assistant = b.turns.filter((t) => t.role === 'assistant');
        expect(assistant.filter((t) => t.continuesTurn !== true)).toHaveLength(turns.length);
        expect(b.policyVersionMin).toBe(firstVersion);
        expect(b.policyVersionMax).toBe(version);
      }),
      { numRuns: 150 },
    );
  });
});
