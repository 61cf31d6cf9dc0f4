import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { afterAll, describe, expect, it } from 'vitest';
import { JinjaChatTemplate, MAX_RANGE_ITEMS, renderTimeLimitMs } from '../../src/tokens/chat-template.js';
import { TokenLedger } from '../../src/tokens/ledger.js';
import { loadModelBundle } from '../../src/tokens/model-bundle.js';
import { bashTool } from './fixtures.js';
import { FAMILIES, familyDir, familySample, familyToolCall, loadFamily } from './families.js';

// An operator's chat template is a program the server runs, small renders on the event loop itself (no token-pool
// deadline there): one in a runaway loop, possibly only for some content, must be stopped, never block the loop.
const RUNAWAY =
  "{%- for m in messages %}{%- if 'RUNAWAY' in m.content %}{%- for a in range(1500) %}{%- for b in range(1500) %}{%- set x = a %}" +
  '{%- endfor %}{%- endfor %}{%- endif %}<|{{ m.role }}|>{{ m.content }}{%- endfor %}';

describe('a chat template render', () => {
  it('is stopped at its time bound with internal when the template runs away, and the next render is unaffected', () => {
    const template = new JinjaChatTemplate(RUNAWAY);
    const messages = [{ role: 'user' as const, content: 'RUNAWAY now' }];
    const started = performance.now();
    expect(() => template.render(messages, { addGenerationPrompt: true })).toThrow(
      expect.objectContaining({ code: 'internal', message: expect.stringContaining(`ran past its ${Math.round(renderTimeLimitMs(messages))} ms bound`) }),
    );
    // 250 ms for a short conversation; what is left is the time to the next check (512 interpreter steps).
    expect(performance.now() - started).toBeLessThan(renderTimeLimitMs(messages) + 1_000);
    expect(template.render([{ role: 'user', content: 'calm' }], { addGenerationPrompt: true })).toBe('<|user|>calm');
  });

  it(`refuses a range() of more than ${MAX_RANGE_ITEMS} items (invalid_argument) instead of filling the heap`, () => {
    const template = new JinjaChatTemplate('{%- for i in range(10 ** 9) %}.{%- endfor %}');
    expect(() => template.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: true })).toThrow(
      expect.objectContaining({ code: 'invalid_argument', message: expect.stringContaining(`range() of 1000000000 items (at most ${MAX_RANGE_ITEMS})`) }),
    );
  });

  it("keeps range()'s meaning: stop, start and stop, negative steps, empty ranges", () => {
    const template = new JinjaChatTemplate('{{ range(3) | join(",") }}|{{ range(2, 5) | join(",") }}|{{ range(5, 0, -2) | join(",") }}|{{ range(4, 1) | length }}');
    expect(template.render([], { addGenerationPrompt: false })).toBe('0,1,2|2,3,4|5,3,1|0');
  });

  it('gives more time to longer conversations (10 µs per character past 250 ms)', () => {
    expect(renderTimeLimitMs([{ role: 'user', content: 'x'.repeat(400_000) }])).toBe(4_250);
  });

  it.each(FAMILIES)("leaves the %s template's renders as they were, a long conversation well within its bound", async (family) => {
    const { template } = await loadFamily(family);
    const messages = [
      { role: 'system' as const, content: 'You are an agent.' },
      ...Array.from({ length: 200 }, (_, k) => ({ role: k % 2 === 0 ? ('user' as const) : ('assistant' as const), content: `turn ${k} `.repeat(50) })),
      { role: 'user' as const, content: 'last' },
    ];
    const started = performance.now();
    const text = template.render(messages, { addGenerationPrompt: true });
    expect(performance.now() - started).toBeLessThan(renderTimeLimitMs(messages) / 4);
    expect(text).toContain('turn 199 turn 199');
  });
});

describe("an operator's model folder whose template runs away on tool messages holding some text", () => {
  const made: string[] = [];
  afterAll(() => {
    for (const dir of made) rmSync(dir, { recursive: true, force: true });
  });

  it('loads, and fails each turn whose token work meets it with internal after one bound, not one per probe render', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'runaway-template-'));
    made.push(dir);
    cpSync(familyDir('qwen3'), dir, { recursive: true });
    const path = join(dir, 'tokenizer_config.json');
    const config = JSON.parse(readFileSync(path, 'utf8')) as { chat_template: string };
    // The probes find the text the template tests for (contentFlags) and render it in every slot: a tool turn meets it.
    const trap =
      "{%- for m in messages %}{%- if m.role == 'tool' and m.content.startswith('RUN' + 'AWAY') %}{%- for a in range(100000) %}" +
      '{%- for b in range(100000) %}{%- endfor %}{%- endfor %}{%- endif %}{%- endfor %}';
    writeFileSync(path, JSON.stringify({ ...config, chat_template: trap + config.chat_template }));
    const bundle = await loadModelBundle({ dir });
    const ledger = await TokenLedger.create({ tokenizer: bundle.tokenizer, template: bundle.template, messages: [{ role: 'user', content: 'List the files.' }], tools: [bashTool] });
    ledger.appendSampled(familySample(bundle, familyToolCall(bundle, 'ls'), 'stop'));
    for (const content of ['RUNAWAY', 'a.txt']) {
      const started = performance.now();
      await expect(ledger.appendEnvironment([{ role: 'tool', name: 'bash', content }])).rejects.toMatchObject({
        code: 'internal',
        message: expect.stringContaining('ms bound'),
      });
      // Was ~20 s on the event loop: the probes took each overrun for a shape the template refuses and went on.
      expect(performance.now() - started).toBeLessThan(3_000);
    }
    expect(ledger.snapshot().turns.map((t) => t.role)).toEqual(['assistant']);
  });
});
