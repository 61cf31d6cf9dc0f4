import { beforeAll, describe, expect, it } from 'vitest';
import type { ModelBundle } from '../../src/tokens/model-bundle.js';
import { knownSuffixLocality, probeSuffixLocality } from '../../src/tokens/suffix-delta.js';
import { MAX_PROBED_TOOL_LISTS, probeAssistantClosing } from '../../src/tokens/template-delta.js';
import { TokenWork } from '../../src/tokens/token-work.js';
import { MAX_RAW_TOOLS_KEY, toolsChars, toolsKey } from '../../src/tokens/tools-key.js';
import type { ToolSchema } from '../../src/tokens/types.js';
import { bashTool, countingTemplate } from './fixtures.js';
import { familyToolCall, loadFamily } from './families.js';

/** `count` tools whose schemas add up to about `count` × 2.3 KB of JSON, as agent tool sets with long descriptions do. */
function toolSet(count: number, tag: string): ToolSchema[] {
  return Array.from({ length: count }, (_, i) => ({
    type: 'function' as const,
    function: {
      name: `${tag}_${i}`,
      description: `Tool ${i}. ${'Does one thing with care, and reports what it did. '.repeat(45)}`,
      parameters: { type: 'object', properties: { arg: { type: 'string', description: 'the argument' } }, required: ['arg'] },
    },
  }));
}

describe('the per-template probe caches', () => {
  let bundle: ModelBundle;
  beforeAll(async () => {
    bundle = await loadFamily('qwen3');
  });

  it('keep a tool list of any length: 40 KB of schemas are probed once, not again on every environment turn', () => {
    const counting = countingTemplate(bundle.template);
    const tools = toolSet(18, 'long');
    expect(toolsChars(tools)).toBeGreaterThan(40_000);
    const work = TokenWork.inline(bundle.tokenizer, counting);
    const turn = (out: string) => ({
      history: [
        { role: 'user' as const, content: 'go' },
        { role: 'assistant' as const, content: familyToolCall(bundle, 'ls') },
      ],
      added: [{ role: 'tool' as const, content: out, name: 'long_0' }],
      tools,
      closing: probeAssistantClosing(counting, tools),
      stopText: undefined,
    });
    work.environmentIdsSync(turn('first'));
    // The first turn probed the template: a few hundred renders.
    expect(counting.renders).toBeGreaterThan(50);
    expect(knownSuffixLocality(counting, tools)).toBeDefined();
    const probed = counting.renders;
    for (const out of ['second', 'third', 'fourth']) work.environmentIdsSync(turn(out));
    // Later turns: at most a render each (Qwen3 is suffix-local; its deltas come from the skeleton).
    expect(counting.renders - probed).toBeLessThanOrEqual(3);
    // A copy of the list (as a token thread receives it with every task) finds the same entries.
    const copy = structuredClone(tools);
    const before = counting.renders;
    expect(probeSuffixLocality(counting, copy)).toBe(knownSuffixLocality(counting, tools));
    expect(probeAssistantClosing(counting, copy)).toBe('<|im_end|>\n');
    expect(counting.renders).toBe(before);
  });

  it(`keep the ${MAX_PROBED_TOOL_LISTS} tool lists used last: a new list past the bound is kept, the oldest goes`, () => {
    const counting = countingTemplate(bundle.template);
    const lists = Array.from({ length: MAX_PROBED_TOOL_LISTS + 1 }, (_, i) => [{ ...bashTool, function: { ...bashTool.function, name: `t${i}` } }]);
    for (const tools of lists) probeAssistantClosing(counting, tools);
    const afterAll = counting.renders;
    // The newest one is kept (a full cache used to refuse it, and it was probed again on every call)...
    probeAssistantClosing(counting, lists.at(-1));
    expect(counting.renders).toBe(afterAll);
    // ... and the least recently used one went to make room.
    probeAssistantClosing(counting, lists[0]);
    expect(counting.renders).toBeGreaterThan(afterAll);
  });

  it('key a long tool list by its digest, a short one by its JSON, and tell their sizes apart', () => {
    const short = [bashTool];
    expect(toolsKey(short)).toBe(JSON.stringify(short));
    expect(toolsChars(short)).toBe(JSON.stringify(short).length);
    const long = toolSet(2, 'digest');
    const json = JSON.stringify(long);
    expect(json.length).toBeGreaterThan(MAX_RAW_TOOLS_KEY);
    expect(toolsKey(long)).toMatch(/^#[A-Za-z0-9+/]{43}=$/);
    expect(toolsChars(long)).toBe(json.length);
    // Equal lists, equal keys; one character apart, different keys.
    expect(toolsKey(structuredClone(long))).toBe(toolsKey(long));
    const changed = structuredClone(long);
    changed[1]!.function.description += '.';
    expect(toolsKey(changed)).not.toBe(toolsKey(long));
    expect(toolsKey(undefined)).toBe('');
    expect(toolsKey([])).toBe('');
  });
});
