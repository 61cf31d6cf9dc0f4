import { beforeAll, describe, expect, it } from 'vitest';
import { TokenLedger } from '../../src/tokens/ledger.js';
import { loadQwen3, type HfTokenizer } from '../../src/tokens/tokenizer.js';
import type { ChatMessage, ChatTemplate } from '../../src/tokens/types.js';
import { bashTool, canonicalSample, sampled, toolCallText } from './fixtures.js';

let tokenizer: HfTokenizer;
let template: ChatTemplate;
let imEnd: number;
let newline: number;
beforeAll(async () => {
  ({ tokenizer, template } = await loadQwen3());
  imEnd = tokenizer.tokenId('<|im_end|>')!;
  newline = tokenizer.encode('\n')[0]!;
});

const opening: ChatMessage[] = [
  { role: 'system', content: 'You are an agent.' },
  { role: 'user', content: 'List the files, then count them.' },
];

function newLedger(messages: readonly ChatMessage[] = opening): TokenLedger {
  return new TokenLedger({ tokenizer, template, messages, tools: [bashTool] });
}

/** What a fresh tokenization of the whole conversation gives, ending with the next generation prompt. */
function retokenized(ledger: TokenLedger): number[] {
  return tokenizer.encode(template.render(ledger.snapshot().messages, { addGenerationPrompt: true, tools: [bashTool] }));
}

describe('TokenLedger', () => {
  it('starts with the rendered prompt and an empty response', () => {
    const ledger = newLedger();
    const prompt = template.render(opening, { addGenerationPrompt: true, tools: [bashTool] });
    expect(ledger.promptIds).toEqual(tokenizer.encode(prompt));
    expect([...ledger.contextIds()]).toEqual(ledger.promptIds);
    expect(ledger.snapshot()).toMatchObject({ responseIds: [], turns: [], policyVersionMin: 0, totalTokens: ledger.promptIds.length });
  });

  it('keeps non-canonical sampled ids verbatim', async () => {
    const ledger = newLedger();
    const spelled = [...'hello'].map((c) => tokenizer.tokenId(c)!);
    expect(tokenizer.encode('hello')).not.toEqual(spelled);
    const ids = [...spelled, tokenizer.tokenId('Ġworld')!, imEnd];
    ledger.appendSampled(sampled(ids, 'stop'));
    await ledger.appendEnvironment([{ role: 'user', content: 'again' }]);
    const snapshot = ledger.snapshot();
    expect(snapshot.responseIds.slice(0, ids.length)).toEqual(ids);
    expect(snapshot.mask.slice(0, ids.length)).toEqual(ids.map(() => 1));
    expect(snapshot.logprobs.slice(0, ids.length)).toEqual(sampled(ids, 'stop').logprobs);
    expect(snapshot.messages[2]).toEqual({ role: 'assistant', content: 'hello world' });
    expect([...ledger.contextIds()].slice(ledger.promptIds.length, ledger.promptIds.length + ids.length)).toEqual(ids);
  });

  it('matches a fresh tokenization of the conversation when the sampled ids are canonical', async () => {
    const ledger = newLedger();
    const steps: [text: string, ending: 'stop' | 'length', reply: ChatMessage[]][] = [
      [`I will look.\n${toolCallText('ls')}`, 'stop', [{ role: 'tool', name: 'bash', content: 'a.txt\nb.txt' }]],
      [toolCallText('wc -l a.txt b.txt'), 'length', [{ role: 'tool', name: 'bash', content: 'malformed call' }]],
      [
        `Again.\n${toolCallText('wc -l a.txt')}\n${toolCallText('wc -l b.txt')}`,
        'stop',
        [{ role: 'tool', content: '3 a.txt' }, { role: 'tool', content: '4 b.txt' }],
      ],
      ['There are two files with 7 lines in tot', 'length', [{ role: 'user', content: 'Finish the sentence.' }]],
      ['total.', 'stop', [{ role: 'user', content: 'Thanks!' }]],
    ];
    for (const [version, [text, ending, reply]] of steps.entries()) {
      ledger.appendSampled(canonicalSample(tokenizer, text, ending, version));
      await ledger.appendEnvironment(reply, { toolName: 'bash', toolOutcome: 'ok' });
      expect([...ledger.contextIds()]).toEqual(retokenized(ledger));
    }
    const snapshot = ledger.finish();
    expect(snapshot.turns.map((t) => t.role)).toEqual(['assistant', 'tool', 'assistant', 'tool', 'assistant', 'tool', 'assistant', 'user', 'assistant', 'user']);
    expect(snapshot).toMatchObject({ policyVersionMin: 0, policyVersionMax: 4 });
  });

  it('appends the closing the model did not sample: all of it after a length stop, the newline after <|im_end|>', async () => {
    const ledger = newLedger();
    ledger.appendSampled(canonicalSample(tokenizer, 'cut off', 'length'));
    await ledger.appendEnvironment([{ role: 'user', content: 'go on' }]);
    ledger.appendSampled(canonicalSample(tokenizer, 'done', 'stop'));
    await ledger.appendEnvironment([{ role: 'user', content: 'ok' }]);
    const { responseIds, turns } = ledger.snapshot();
    expect(responseIds.slice(turns[1]!.start, turns[1]!.start + 2)).toEqual([imEnd, newline]);
    expect(responseIds[turns[2]!.end - 1]).toBe(imEnd);
    expect(responseIds[turns[3]!.start]).toBe(newline);
  });

  it('closes the turn with <|im_end|> after an <|endoftext|> stop, and keeps it out of the content', async () => {
    const ledger = newLedger();
    const eot = tokenizer.tokenId('<|endoftext|>')!;
    ledger.appendSampled(sampled([...tokenizer.encode('bye'), eot], 'stop'));
    await ledger.appendEnvironment([{ role: 'user', content: 'ok' }]);
    const { responseIds, messages } = ledger.snapshot();
    expect(messages.at(-2)).toEqual({ role: 'assistant', content: 'bye' });
    expect(tokenizer.decode(responseIds)).toMatch(/^bye<\|endoftext\|><\|im_end\|>\n<\|im_start\|>user\nok/);
  });

  it('keeps the reasoning it sampled within a tool loop, like the template', async () => {
    const ledger = newLedger();
    ledger.appendSampled(canonicalSample(tokenizer, `<think>\nCheck the dir.\n</think>\n\n${toolCallText('ls')}`, 'stop'));
    await ledger.appendEnvironment([{ role: 'tool', content: 'a.txt' }], { toolName: 'bash', toolOutcome: 'ok' });
    ledger.appendSampled(canonicalSample(tokenizer, '<think>\nOne file.\n</think>\n\nOne file.', 'stop'));
    await ledger.appendEnvironment([{ role: 'tool', content: 'b.txt' }]);
    expect([...ledger.contextIds()]).toEqual(retokenized(ledger));
    expect(ledger.deltaMethods.anchor).toBe(2);
  });

  it('keeps the reasoning the model saw after a new user query, where a re-render would drop it', async () => {
    const ledger = newLedger();
    ledger.appendSampled(canonicalSample(tokenizer, '<think>\nsecret plan\n</think>\n\nDone.', 'stop'));
    await ledger.appendEnvironment([{ role: 'user', content: 'And now?' }]);
    expect(tokenizer.decode([...ledger.contextIds()])).toContain('secret plan');
    expect(tokenizer.decode(retokenized(ledger))).not.toContain('secret plan');
    expect(ledger.deltaMethods.anchor).toBe(1);
    expect(tokenizer.decode([...ledger.contextIds()]).endsWith('Done.<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n')).toBe(true);
  });

  it('records what the model saw with enable_thinking=false: the empty think block of each generation prompt', async () => {
    const bundle = await loadQwen3({ enable_thinking: false });
    const ledger = new TokenLedger({ tokenizer, template: bundle.template, messages: opening });
    ledger.appendSampled(canonicalSample(tokenizer, 'Hi.', 'stop'));
    await ledger.appendEnvironment([{ role: 'user', content: 'Hi?' }]);
    const text = tokenizer.decode([...ledger.contextIds()]);
    expect(text.endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\nHi.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n')).toBe(true);
  });

  it('labels environment turns with the tool and its outcome', async () => {
    const ledger = newLedger();
    ledger.appendSampled(canonicalSample(tokenizer, toolCallText('ls'), 'stop', 7));
    await ledger.appendEnvironment([{ role: 'tool', name: 'bash', content: 'no such tool' }], { toolName: 'bsh', toolOutcome: 'malformed' });
    const { turns } = ledger.snapshot();
    expect(turns[0]).toMatchObject({ role: 'assistant', backend: 'fake-engine', policyVersion: 7, finishReason: 'stop' });
    expect(turns[1]).toMatchObject({ role: 'tool', toolName: 'bsh', toolOutcome: 'malformed' });
  });

  it('accepts an empty completion as an empty assistant turn', async () => {
    const ledger = newLedger();
    ledger.appendSampled(sampled([], 'length'));
    await ledger.appendEnvironment([{ role: 'user', content: 'hello?' }]);
    const { turns, messages } = ledger.snapshot();
    expect(turns[0]).toMatchObject({ start: 0, end: 0 });
    expect(messages[2]).toEqual({ role: 'assistant', content: '' });
  });

  it('returns the decoded content of a completion and exposes the conversation', () => {
    const ledger = newLedger();
    expect(ledger.appendSampled(canonicalSample(tokenizer, toolCallText('ls'), 'stop'))).toBe(toolCallText('ls'));
    const messages = ledger.messages;
    messages.pop();
    expect(ledger.messages).toEqual([...opening, { role: 'assistant', content: toolCallText('ls') }]);
  });

  it('returns snapshots that are copies', () => {
    const ledger = newLedger();
    ledger.appendSampled(canonicalSample(tokenizer, 'a', 'stop'));
    const snapshot = ledger.snapshot();
    snapshot.responseIds.push(1);
    snapshot.messages.pop();
    expect(ledger.snapshot().responseIds).toHaveLength(2);
    expect(ledger.snapshot().messages).toHaveLength(3);
  });

  describe('refuses', () => {
    it('an empty first conversation', () => {
      expect(() => newLedger([])).toThrow(expect.objectContaining({ code: 'invalid_argument' }));
    });

    it('turns out of order', async () => {
      const ledger = newLedger();
      await expect(ledger.appendEnvironment([{ role: 'user', content: 'x' }])).rejects.toMatchObject({ code: 'failed_precondition' });
      ledger.appendSampled(canonicalSample(tokenizer, 'a', 'stop'));
      expect(() => ledger.appendSampled(canonicalSample(tokenizer, 'b', 'stop'))).toThrow(expect.objectContaining({ code: 'failed_precondition' }));
      const final = ledger.finish();
      expect(ledger.finish()).toEqual(final);
      await expect(ledger.appendEnvironment([{ role: 'user', content: 'x' }])).rejects.toMatchObject({ code: 'failed_precondition' });
    });

    it('environment messages that are empty or claim to be the assistant', async () => {
      const ledger = newLedger();
      ledger.appendSampled(canonicalSample(tokenizer, 'a', 'stop'));
      await expect(ledger.appendEnvironment([])).rejects.toMatchObject({ code: 'invalid_argument' });
      await expect(ledger.appendEnvironment([{ role: 'assistant', content: 'x' }])).rejects.toMatchObject({ code: 'invalid_argument' });
    });

    it('a completion whose logprobs do not match its ids', () => {
      const ledger = newLedger();
      expect(() => ledger.appendSampled({ ...sampled([1, 2], 'stop'), logprobs: [-1] })).toThrow(expect.objectContaining({ code: 'backend_error' }));
      expect(() => ledger.appendSampled({ ...sampled([1.5], 'stop') })).toThrow(expect.objectContaining({ code: 'backend_error' }));
      expect(ledger.snapshot().responseIds).toEqual([]);
    });

    it('a token id beyond int32 (the contract\'s type and the ledger\'s column): refused, never stored wrapped', () => {
      const ledger = newLedger();
      expect(() => ledger.appendSampled({ ...sampled([2 ** 31], 'stop') })).toThrow(expect.objectContaining({ code: 'backend_error' }));
      ledger.appendSampled({ ...sampled([2 ** 31 - 1], 'length') });
      expect(ledger.snapshot().responseIds).toEqual([2 ** 31 - 1]);
    });
  });
});
