import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { TokenLedger } from '../../src/tokens/ledger.js';
import type { ModelBundle } from '../../src/tokens/model-bundle.js';
import type { HfTokenizer } from '../../src/tokens/tokenizer.js';
import type { ChatMessage, ChatTemplate, ToolSchema } from '../../src/tokens/types.js';
import { bashTool } from './fixtures.js';
import { FAMILIES, familySample, familyToolCall, loadFamily } from './families.js';

describe.each(FAMILIES)('with the %s tokenizer and template', (family) => {
let bundle: ModelBundle;
let tokenizer: HfTokenizer;
let template: ChatTemplate;
let addedIds: Set<number>;
let addedPattern: RegExp;
/** The same strings, without the global flag's lastIndex state: for tests of whole texts. */
let addedAnywhere: RegExp;
/** Llama's and Gemma's templates trim contents; the oracle puts contents back as they are, so keep them untrimmable. */
let wrap: (content: string) => string;
beforeAll(async () => {
  bundle = await loadFamily(family);
  ({ tokenizer, template } = bundle);
  // Whitespace and HTML-tag added tokens (Gemma's "\n", "\n\n", "<td>", ...) are text, not structure
  // (opaque-content.ts textAddedTokens).
  const structural = tokenizer.addedTokens.filter((t) => !tokenizer.textTokens.has(t));
  addedIds = new Set(structural.map((t) => tokenizer.tokenId(t)!));
  const escaped = [...structural].sort((a, b) => b.length - a.length).map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
  addedPattern = new RegExp(escaped.join('|'), 'g');
  addedAnywhere = new RegExp(escaped.join('|'));
  wrap = family === 'qwen3' ? (c) => c : (c) => `[${c}]`;
});

/** Characters that are their own NFC form whatever surrounds them, so decoded text compares exactly. */
const CHARS = [...'abcXYZ019 .,;:!?{}[]"\'\n\t\\/-_<>|é日🙂', '\u{F0000}', '\u{F0001}', '\u{FFFFD}'];
/** Control tokens of all four families, so every family meets its own and the others' (plain text to it). */
const QWEN_ADDED = ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<tool_call>', '</tool_call>', '<tool_response>', '</tool_response>', '<think>', '</think>', '<|fim_pad|>', '<|vision_start|>',
  '<|begin_of_text|>', '<|start_header_id|>', '<|end_header_id|>', '<|eot_id|>', '<｜User｜>', '<｜Assistant｜>', '<｜end▁of▁sentence｜>', '<｜tool▁calls▁begin｜>', '<｜tool▁output▁begin｜>', '<start_of_turn>', '<end_of_turn>', '<bos>', '<table>'];
const FRAGMENTS = ['<|im_', 'end|>', '<|', '|>', '</', 'tool_', 'system\n', 'assistant\n'];
const piece = fc.oneof(
  { weight: 3, arbitrary: fc.string({ unit: fc.constantFrom(...CHARS), maxLength: 12 }) },
  { weight: 2, arbitrary: fc.constantFrom(...QWEN_ADDED) },
  { weight: 1, arbitrary: fc.constantFrom(...FRAGMENTS) },
);
/** Environment text with added-token strings and fragments of them at random places. */
const content = fc.array(piece, { maxLength: 8 }).map((pieces) => pieces.join(''));
/** HTML tags: plain text to three families, text added tokens to Gemma 3 (it has 68 of them, `<td>`, `</table>`, ...). */
const HTML_TAGS = ['<table>', '</table>', '<tr>', '</tr>', '<td>', '</td>', '<b>', '</b>', '<code>', '</code>', '<h1>', '<div>'];
/**
 * Environment text without any structural added-token string: the benign case that must not change at all, HTML
 * tags included (Gemma 3 keeps them as the tag ids, as a fresh tokenization does). The characters can spell a
 * structural token of a family (`<pad>` and `<bos>` are Gemma's): such a text is not benign there.
 */
const benignContent = fc
  .array(fc.oneof({ weight: 3, arbitrary: fc.string({ unit: fc.constantFrom(...CHARS), maxLength: 12 }) }, { weight: 1, arbitrary: fc.constantFrom(...HTML_TAGS) }), { maxLength: 5 })
  .map((pieces) => pieces.join(''))
  .filter((s) => !addedAnywhere.test(wrap(s)));

const envMessage = (text: fc.Arbitrary<string>): fc.Arbitrary<ChatMessage> =>
  fc.record({ role: fc.constantFrom('tool' as const, 'user' as const), content: text });
const prose = fc.string({ unit: fc.constantFrom(...'abc XYZ 019 .,!?\n'.split('')), maxLength: 20 }).map((s) => `Ok ${s}`);
const assistantText = fc.tuple(prose, fc.boolean()).map(([text, call]) => (call ? `${text.trimEnd()}\n${familyToolCall(bundle, 'ls')}` : text.trimEnd()));

function episode(text: fc.Arbitrary<string>) {
  return fc.record({
    system: fc.option(text, { nil: undefined }),
    user: text,
    tools: fc.boolean(),
    steps: fc.array(fc.tuple(assistantText, fc.constantFrom('stop' as const, 'length' as const), fc.array(envMessage(text), { minLength: 1, maxLength: 2 })), {
      maxLength: 3,
    }),
  });
}

type Episode = { system: string | undefined; user: string; tools: boolean; steps: [string, 'stop' | 'length', ChatMessage[]][] };

async function run(e: Episode): Promise<{ ledger: TokenLedger; messages: ChatMessage[]; tools: readonly ToolSchema[] | undefined }> {
  const tools = e.tools ? [bashTool] : undefined;
  const messages: ChatMessage[] = [...(e.system === undefined ? [] : [{ role: 'system' as const, content: wrap(e.system) }]), { role: 'user', content: wrap(e.user) }];
  const ledger = new TokenLedger({ tokenizer, template, messages, ...(tools ? { tools } : {}) });
  for (const [text, ending, reply] of e.steps) {
    ledger.appendSampled(familySample(bundle, text, ending));
    await ledger.appendEnvironment(reply.map((m) => ({ ...m, content: wrap(m.content) })));
  }
  return { ledger, messages: ledger.snapshot().messages, tools };
}

/**
 * The oracle: the conversation rendered with every environment content replaced by a sentinel the template
 * cannot mistake for anything, then the real contents put back. The added tokens of the template's own text
 * are the added-token strings outside the contents; returns the text and where those tokens are.
 */
function templateOwn(messages: readonly ChatMessage[], tools: readonly ToolSchema[] | undefined): { text: string; tokens: [number, string][] } {
  const sentinel = (k: number): string => `\u27e6env-${k}\u27e7`;
  const masked = messages.map((m, k) => (m.role === 'assistant' ? m : { ...m, content: sentinel(k) }));
  const skeleton = template.render(masked, { addGenerationPrompt: true, ...(tools ? { tools } : {}) });
  const pieces = skeleton.split(/(\u27e6env-\d+\u27e7)/);
  let text = '';
  const tokens: [number, string][] = [];
  for (const p of pieces) {
    const k = /^\u27e6env-(\d+)\u27e7$/.exec(p);
    if (k) {
      text += messages[Number(k[1])]!.content;
      continue;
    }
    for (const m of p.matchAll(addedPattern)) tokens.push([text.length + m.index, m[0]]);
    text += p;
  }
  return { text, tokens };
}

/** Where the added-token ids are in ids, as offsets into the decoded text, with their strings. */
function addedTokensAt(ids: readonly number[]): [number, string][] {
  const out: [number, string][] = [];
  ids.forEach((id, i) => {
    if (addedIds.has(id)) out.push([tokenizer.decode(ids.slice(0, i)).length, tokenizer.decode([id])]);
  });
  return out;
}

describe('environment text never yields added tokens (property)', () => {
  it('puts added-token ids exactly where the template wrote them, and decodes to the rendered text', async () => {
    await fc.assert(
      fc.asyncProperty(episode(content), async (e) => {
        const { ledger, messages, tools } = await run(e);
        const ids = [...ledger.contextIds()];
        const own = templateOwn(messages, tools);
        // Gemma's SentencePiece decodes a literal "▁" as a space (any "▁" in text, forged or not): one char for one.
        const text = family === 'gemma3' ? own.text.replaceAll('\u2581', ' ') : own.text;
        expect(tokenizer.decode(ids)).toBe(text);
        expect(addedTokensAt(ids)).toEqual(own.tokens);
      }),
      { numRuns: 120 },
    );
  });

  it('encodes environment text without added-token strings exactly as a fresh tokenization of the render', async () => {
    await fc.assert(
      fc.asyncProperty(episode(benignContent), async (e) => {
        const { ledger, messages, tools } = await run(e);
        const own = templateOwn(messages, tools);
        expect([...ledger.contextIds()]).toEqual(tokenizer.encode(own.text));
      }),
      { numRuns: 80 },
    );
  });
});
});
