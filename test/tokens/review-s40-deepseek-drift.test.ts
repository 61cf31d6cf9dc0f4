import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { TokenLedger, type SampledTurn } from '../../src/tokens/ledger.js';
import type { ModelBundle } from '../../src/tokens/model-bundle.js';
import type { ChatMessage, ToolSchema } from '../../src/tokens/types.js';
import { bashTool } from './fixtures.js';
import { loadFamily } from './families.js';

// Review s40: re-tokenization drift with DeepSeek-V3's real tokenizer and chat template. The drift checks of the
// other families split a sampled text character by character ([...text].flatMap(encode)), which for DeepSeek-V3 also
// spells its tool-call markers (<｜tool▁calls▁begin｜>, ... : single added tokens the model samples as one id each) as
// plain characters: the "calls" were then text no DeepSeek-V3 model samples. Here the markers are sampled as their
// ids and only the text between them drifts (each character, or each short run of characters, encoded on its own), so
// decode-then-encode gives other ids. The ledger must keep the sampled ids verbatim, and every next prompt must
// continue from them: it is the template's render of the conversation as text, but never its re-encoding.

let bundle: ModelBundle;
let markers: ReadonlyMap<string, number>;
let markerPattern: RegExp;
let eos: number;
beforeAll(async () => {
  bundle = await loadFamily('deepseek_v3');
  const { tokenizer } = bundle;
  const structural = tokenizer.addedTokens.filter((t) => !tokenizer.textTokens.has(t) && t.startsWith('<｜'));
  markers = new Map(structural.map((t) => [t, tokenizer.tokenId(t)!]));
  markerPattern = new RegExp(`(${[...markers.keys()].map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|')})`, 'u');
  eos = tokenizer.stopTokenIds[0]!;
});

/**
 * Ids a model could sample for `text` that are not its tokenization: markers as their added-token ids, the text
 * between them cut into runs of `run(k)` characters (1: per character), each run encoded on its own.
 */
function drifted(text: string, run: (k: number) => number = () => 1): number[] {
  const ids: number[] = [];
  let k = 0;
  for (const part of text.split(markerPattern)) {
    const id = markers.get(part);
    if (id !== undefined) {
      ids.push(id);
      continue;
    }
    const chars = [...part];
    for (let i = 0; i < chars.length; ) {
      const n = Math.max(1, run(k++));
      ids.push(...bundle.tokenizer.encode(chars.slice(i, i + n).join('')));
      i += n;
    }
  }
  return ids;
}

function sample(ids: readonly number[], finishReason: SampledTurn['finishReason'], policyVersion: number): SampledTurn {
  return { tokenIds: ids, logprobs: ids.map((_, i) => -(i + 1) / 512), backend: 'engine', policyVersion, finishReason };
}

const tools: readonly ToolSchema[] = [bashTool];
const render = (messages: readonly ChatMessage[]): string => bundle.template.render(messages, { addGenerationPrompt: true, tools });

interface Step {
  /** What the model writes (its tool calls in DeepSeek-V3's format). */
  text: string;
  finish: 'stop' | 'length';
  /** The calls the parser must read back from the sampled message. */
  calls: { name: string; arguments: Record<string, unknown> }[];
  /** How many parse errors the message has (a call cut by the length limit). */
  errors?: number;
  /** The environment's answer. */
  reply: ChatMessage[];
}

/** Runs `steps` through a ledger, checking after every turn what the engine is sent next. */
async function run(steps: readonly Step[], runLength: (k: number) => number = () => 1): Promise<number> {
  const { tokenizer, parser } = bundle;
  const opening: ChatMessage[] = [{ role: 'system', content: 'Use the tools. Überprüfe alles.' }, { role: 'user', content: 'Count the files in 目录 and report 42.' }];
  const ledger = await TokenLedger.create({ tokenizer, template: bundle.template, messages: opening, tools });
  let context = [...ledger.contextIds()];
  const sampledSpans: { at: number; ids: number[] }[] = [];
  let drifts = 0;
  for (const [k, step] of steps.entries()) {
    const ids = [...drifted(step.text, runLength), ...(step.finish === 'stop' ? [eos] : [])];
    const body = step.finish === 'stop' ? ids.slice(0, -1) : ids;
    if (step.finish === 'stop') expect(tokenizer.decode(body)).toBe(step.text);
    // The drift is real: decoding and encoding again gives other ids.
    if (tokenizer.encode(tokenizer.decode(body)).join() !== body.join()) drifts++;
    const content = ledger.appendSampled(sample(ids, step.finish, k + 1));
    expect(content).toBe(tokenizer.decode(body));
    const parsed = parser.parse(content);
    expect(parsed.calls).toEqual(step.calls);
    expect(parsed.errors).toHaveLength(step.errors ?? 0);
    sampledSpans.push({ at: context.length, ids });
    const afterSample = [...ledger.contextIds()];
    expect(afterSample).toEqual([...context, ...ids]);
    expect(await ledger.appendEnvironment(step.reply, { toolName: 'bash', toolOutcome: 'ok' })).toBe(true);
    const next = [...ledger.contextIds()];
    // The next prompt continues from the sampled ids: every earlier id in place, the sampled spans verbatim.
    expect(next.slice(0, afterSample.length)).toEqual(afterSample);
    for (const span of sampledSpans) expect(next.slice(span.at, span.at + span.ids.length)).toEqual(span.ids);
    // It is the template's render of the conversation as text...
    const snapshot = ledger.snapshot();
    const rendered = render(snapshot.messages);
    expect(tokenizer.decode(next)).toBe(rendered);
    // ... and not its re-encoding (which would put ids the policy never sampled in the record), once a span drifted.
    if (drifts > 0) expect(next).not.toEqual(tokenizer.encode(rendered));
    // The environment's span (mask 0) is the tokenization of the template's text between the turns, nothing sampled.
    const env = snapshot.turns.at(-1)!;
    const envIds = snapshot.responseIds.slice(env.start, env.end);
    expect(envIds).toEqual(tokenizer.encode(tokenizer.decode(envIds)));
    expect(snapshot.mask.slice(env.start, env.end).every((m) => m === 0)).toBe(true);
    context = next;
  }
  const final = ledger.finish();
  const assistant = final.turns.filter((t) => t.role === 'assistant');
  expect(assistant).toHaveLength(steps.length);
  for (const [k, turn] of assistant.entries()) {
    const ids = sampledSpans[k]!.ids;
    expect(final.responseIds.slice(turn.start, turn.end)).toEqual(ids);
    expect(final.logprobs.slice(turn.start, turn.end)).toEqual(ids.map((_, i) => -(i + 1) / 512));
    expect(final.mask.slice(turn.start, turn.end).every((m) => m === 1)).toBe(true);
  }
  return drifts;
}

describe('review s40: DeepSeek-V3 sampled ids that re-tokenize to other ids', () => {
  it('keeps them verbatim over a multi-turn tool conversation, each next prompt continuing from them', async () => {
    const { parser } = bundle;
    const call = (cmd: string): string => parser.format([{ name: 'bash', arguments: { cmd } }]);
    const drifts = await run([
      {
        text: `Let me look first: 12345 files?\n\n${call('ls -la 目录 | wc -l')}`,
        finish: 'stop',
        calls: [{ name: 'bash', arguments: { cmd: 'ls -la 目录 | wc -l' } }],
        reply: [{ role: 'tool', name: 'bash', content: '42\n' }],
      },
      {
        text: `Two checks 🙂\n${parser.format([
          { name: 'bash', arguments: { cmd: 'find 目录 -type f | wc -l' } },
          { name: 'bash', arguments: { cmd: 'echo "done"; printf \'%s\\n\' 1000000' } },
        ])}`,
        finish: 'stop',
        calls: [
          { name: 'bash', arguments: { cmd: 'find 目录 -type f | wc -l' } },
          { name: 'bash', arguments: { cmd: 'echo "done"; printf \'%s\\n\' 1000000' } },
        ],
        reply: [
          { role: 'tool', name: 'bash', content: '42' },
          { role: 'tool', name: 'bash', content: 'done\n1000000' },
        ],
      },
      // Cut by the length limit inside the call (no eos): the closing is the template's, the call unread.
      {
        text: `${call('cat 目录/a.txt').slice(0, 60)}`,
        finish: 'length',
        calls: [],
        errors: 1,
        reply: [{ role: 'user', content: 'You were cut off; answer now.' }],
      },
      { text: 'There are 42 files in 目录. Überprüft.', finish: 'stop', calls: [], reply: [{ role: 'user', content: 'Thanks.' }] },
    ]);
    expect(drifts).toBe(4);
  });

  it('keeps them verbatim for random texts, calls and drift patterns', async () => {
    const chars = fc.constantFrom(...'ab Z09.,;\n\t{}[]"\'\\$|中文目录🙂é—'.split(/(?:)/u));
    const text = fc.string({ unit: chars, maxLength: 24 });
    let driftedTurns = 0;
    const step = fc.record({ prose: text, cmds: fc.array(text, { maxLength: 2 }), output: text, length: fc.boolean() });
    await fc.assert(
      fc.asyncProperty(fc.array(step, { minLength: 1, maxLength: 4 }), fc.array(fc.integer({ min: 1, max: 4 }), { minLength: 1, maxLength: 8 }), async (steps, runs) => {
        const { parser } = bundle;
        driftedTurns += await run(
          steps.map(({ prose, cmds, output, length }): Step => {
            const calls = cmds.map((cmd) => ({ name: 'bash', arguments: { cmd } }));
            const body = `Q${prose}${calls.length > 0 ? `\n${parser.format(calls)}` : ''}`;
            return {
              // A length stop keeps the whole text but no eos (the calls are complete: the parser reads them).
              text: body,
              finish: length ? 'length' : 'stop',
              calls,
              reply: calls.length > 0 ? calls.map(() => ({ role: 'tool', name: 'bash', content: `o${output}` })) : [{ role: 'user', content: `u${output}` }],
            };
          }),
          (k) => runs[k % runs.length]!,
        );
      }),
      { numRuns: 30 },
    );
    // Most turns drift (a turn of one character, or of characters that are tokens alone, cannot).
    expect(driftedTurns).toBeGreaterThan(30);
  });
});
