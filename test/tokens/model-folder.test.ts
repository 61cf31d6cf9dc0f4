import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { loadModelBundle, modelBundleFromContents, type ModelBundle } from '../../src/tokens/model-bundle.js';
import { loadedModelContents } from '../../src/tokens/tokenizer.js';
import { vocabSize } from '../../src/tokens/vocab.js';
import type { TokenPool } from '../../src/tokens/token-pool.js';
import type { TokenTask, TokenTaskResult } from '../../src/tokens/token-tasks.js';
import { createTokenPool, TokenWork } from '../../src/tokens/token-work.js';
import type { ChatMessage } from '../../src/tokens/types.js';
import { familyDir, type Family } from './families.js';
import { bashTool } from './fixtures.js';

/** Private copies of shipped model folders, removed after the file's tests. */
const made: string[] = [];
const pools: TokenPool<TokenTask, TokenTaskResult>[] = [];
afterAll(async () => {
  await Promise.all(pools.splice(0).map((p) => p.close()));
  for (const dir of made.splice(0)) rmSync(dir, { recursive: true, force: true });
});

/** A copy of a family's model folder, with its own chat_template.jinja and tokenizer_config.json edits if given. */
function modelCopy(family: Family, edit: { jinja?: string; config?: (c: Record<string, unknown>) => void } = {}): string {
  const dir = mkdtempSync(join(tmpdir(), `model-folder-${family}-`));
  made.push(dir);
  cpSync(familyDir(family), dir, { recursive: true });
  if (edit.jinja !== undefined) writeFileSync(join(dir, 'chat_template.jinja'), edit.jinja);
  if (edit.config) {
    const path = join(dir, 'tokenizer_config.json');
    const config = JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>;
    edit.config(config);
    writeFileSync(path, JSON.stringify(config));
  }
  return dir;
}

/** Every task on the pool's thread, and the same work inline, for a bundle. */
function threadedAndInline(bundle: ModelBundle, pool: TokenPool<TokenTask, TokenTaskResult>): { threaded: TokenWork; inline: TokenWork } {
  pools.push(pool);
  return {
    threaded: new TokenWork({ tokenizer: bundle.tokenizer, template: bundle.template, pool, inlineMaxChars: 0 }),
    inline: new TokenWork({ tokenizer: bundle.tokenizer, template: bundle.template }),
  };
}

const messages: ChatMessage[] = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'What is 2+2?' }];

// A token thread starts with the first large task and again after every crash, possibly hours after start-up: it
// must tokenize with the files the server read then, not with whatever the folder holds by that time.
describe('token threads and the model folder the server loaded', () => {
  it('tokenize with the template the server loaded, even if the folder changed before the thread started', async () => {
    const dir = modelCopy('qwen3');
    const bundle = await loadModelBundle({ dir });
    const { threaded, inline } = threadedAndInline(bundle, createTokenPool({ dir }, { size: 1 }));
    // A newer template revision lands in the folder (here: Qwen3's no-think block in the generation prompt).
    const config = JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8')) as { chat_template: string };
    writeFileSync(join(dir, 'chat_template.jinja'), config.chat_template.replace("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}"));
    expect(Array.from(await threaded.promptIds(messages, undefined))).toEqual(Array.from(inline.promptIdsSync(messages, undefined)));
  });

  it('keep working when the folder is gone, also on the thread that replaces a crashed one', async () => {
    const dir = modelCopy('qwen3');
    const bundle = await loadModelBundle({ dir });
    // TEST DOUBLE script: the real token worker, ending its thread on a task that mentions the marker.
    const pool = createTokenPool({ dir }, { size: 1, script: new URL('../support/crashing-token-worker.mjs', import.meta.url) });
    const { threaded, inline } = threadedAndInline(bundle, pool);
    rmSync(dir, { recursive: true, force: true });
    expect(Array.from(await threaded.promptIds(messages, undefined))).toEqual(Array.from(inline.promptIdsSync(messages, undefined)));
    await expect(threaded.promptIds([{ role: 'user', content: 'CRASH-THE-TOKEN-WORKER' }], undefined)).rejects.toMatchObject({ code: 'internal' });
    expect(Array.from(await threaded.promptIds(messages, [bashTool]))).toEqual(Array.from(inline.promptIdsSync(messages, [bashTool])));
    expect(pool.stats()).toMatchObject({ crashes: 1 });
  });

  it('use the packaged Qwen3 the server loaded when no folder is configured', async () => {
    const bundle = await loadModelBundle();
    const { threaded, inline } = threadedAndInline(bundle, createTokenPool({}, { size: 1 }));
    expect(Array.from(await threaded.promptIds(messages, [bashTool]))).toEqual(Array.from(inline.promptIdsSync(messages, [bashTool])));
  });

  it('are refused for a folder the server has not loaded (failed_precondition)', () => {
    const dir = modelCopy('qwen3');
    expect(() => createTokenPool({ dir })).toThrow(expect.objectContaining({ code: 'failed_precondition' }) as Error);
  });
});

// An empty template, or one that writes none of the messages, made every prompt 0 tokens and every environment turn
// append nothing: the environment's text silently vanished from what the model saw.
describe('a chat template that does not write the conversation', () => {
  it('is refused at start-up when chat_template.jinja is empty, naming the file (no fall-back to the config\'s template)', async () => {
    for (const jinja of ['', ' \n\n']) {
      const dir = modelCopy('qwen3', { jinja });
      await expect(loadModelBundle({ dir })).rejects.toMatchObject({ code: 'failed_precondition', message: expect.stringContaining(join(dir, 'chat_template.jinja')) });
    }
  });

  it('is refused when it renders fixed text, or drops the system message, naming the file', async () => {
    for (const jinja of ['<|im_start|>assistant\n', '{% for m in messages %}{% if m.role != "system" %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}']) {
      const dir = modelCopy('qwen3', { jinja });
      await expect(loadModelBundle({ dir })).rejects.toMatchObject({ code: 'failed_precondition', message: expect.stringContaining('chat_template.jinja') });
    }
    const dir = modelCopy('qwen3', { config: (c) => void (c.chat_template = '') });
    await expect(loadModelBundle({ dir })).rejects.toMatchObject({ code: 'failed_precondition', message: expect.stringContaining('tokenizer_config.json chat_template') });
  });

  it('is accepted when it refuses system messages but writes the others', async () => {
    const jinja = '{% for m in messages %}{% if m.role == "system" %}{{ raise_exception("no system") }}{% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}';
    const bundle = await loadModelBundle({ dir: modelCopy('qwen3', { jinja }) });
    expect(bundle.template.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: false })).toBe('[user]hi');
  });
});

/**
 * Named templates in tokenizer_config.json (Hermes-2-Pro, Hermes-3, Command-R) are picked as transformers
 * (get_chat_template), and so vLLM, picks them: "tool_use" for a conversation with tools when there is one,
 * "default" otherwise, and no "default" is an error.
 */
const DEFAULT = '{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}';
// Iterates `tools` unguarded (it is only ever given some) and has a tool role of its own.
const TOOL_USE =
  '<|im_start|>system\nTOOL-USE <tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n' +
  '{% for m in messages %}{% if m.role == "tool" %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n' +
  '{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}';

function namedCopy(entries: unknown[]): string {
  return modelCopy('qwen3', { config: (c) => void (c.chat_template = entries) });
}

describe('named chat templates in tokenizer_config.json', () => {
  it('render a conversation with tools through "tool_use", one without through "default", each probed and shaped on its own', async () => {
    const bundle = await loadModelBundle({ dir: namedCopy([{ name: 'default', template: DEFAULT }, { name: 'tool_use', template: TOOL_USE }]) });
    const user: ChatMessage[] = [{ role: 'user', content: 'hi' }];
    expect(bundle.template.render(user, { addGenerationPrompt: true, tools: [bashTool] })).toContain('TOOL-USE <tools>{"type": "function"');
    expect(bundle.template.render(user, { addGenerationPrompt: true })).toBe('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
    expect(bundle.template.render(user, { addGenerationPrompt: true, tools: [] })).not.toContain('TOOL-USE');
    // Plain ChatML prints any role: no tool role of its own; "tool_use" has one (found although it needs tools to render).
    expect(bundle.profile).toMatchObject({ toolRole: false, rendersTools: false });
    expect(bundle.toolUseProfile).toMatchObject({ toolRole: true, rendersTools: true });
    const conversation: ChatMessage[] = [...user, { role: 'assistant', content: 'x' }, { role: 'tool', name: 'bash', content: 'OUT' }];
    expect(bundle.template.render(conversation, { addGenerationPrompt: false, tools: [bashTool] })).toContain('<tool_response>\nOUT\n</tool_response>');
    expect(bundle.template.render(conversation, { addGenerationPrompt: false })).toContain('Output of tool "bash":\nOUT');
  });

  it('give a token thread the same renders as the server', async () => {
    const dir = namedCopy([{ name: 'default', template: DEFAULT }, { name: 'tool_use', template: TOOL_USE }]);
    const bundle = await loadModelBundle({ dir });
    const { threaded, inline } = threadedAndInline(bundle, createTokenPool({ dir }, { size: 1 }));
    for (const tools of [undefined, [bashTool]]) {
      expect(Array.from(await threaded.promptIds(messages, tools))).toEqual(Array.from(inline.promptIdsSync(messages, tools)));
    }
  });

  it('use "default" for everything without a "tool_use", and take the last of one name', async () => {
    const bundle = await loadModelBundle({ dir: namedCopy([{ name: 'default', template: 'old {{ messages[0].content }}' }, { name: 'rag', template: 'RAG' }, { name: 'default', template: DEFAULT }]) });
    expect(bundle.template.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: false, tools: [bashTool] })).toMatch(/^<\|im_start\|>system\n/);
    expect(bundle.toolUseProfile).toBeUndefined();
  });

  it('are refused without a "default", and with a malformed entry, naming tokenizer_config.json (failed_precondition)', async () => {
    const lists: unknown[][] = [
      [{ name: 'rag', template: 'RAG {{ messages[0].content }}' }, { name: 'tool_use', template: TOOL_USE }],
      [],
      [null, { name: 'default', template: DEFAULT }],
      [{ name: 'default', template: DEFAULT }, { name: 'tool_use' }],
      [{ name: 7, template: DEFAULT }],
      ['{{ messages }}'],
    ];
    for (const list of lists) {
      await expect(loadModelBundle({ dir: namedCopy(list) })).rejects.toMatchObject({ code: 'failed_precondition', message: expect.stringContaining('tokenizer_config.json') });
    }
    const dir = modelCopy('qwen3', { config: (c) => void (c.chat_template = { default: DEFAULT }) });
    await expect(loadModelBundle({ dir })).rejects.toMatchObject({ code: 'failed_precondition' });
  });

  it('are refused when "tool_use" does not write the conversation, naming it', async () => {
    const dir = namedCopy([{ name: 'default', template: DEFAULT }, { name: 'tool_use', template: '{% for t in tools %}{{ t | tojson }}{% endfor %}' }]);
    await expect(loadModelBundle({ dir })).rejects.toMatchObject({ code: 'failed_precondition', message: expect.stringContaining('chat_template "tool_use"') });
  });

  it('are read from additional_chat_templates/tool_use.jinja next to chat_template.jinja, as transformers saves them now', async () => {
    const dir = modelCopy('qwen3', { jinja: DEFAULT });
    mkdirSync(join(dir, 'additional_chat_templates'));
    writeFileSync(join(dir, 'additional_chat_templates', 'tool_use.jinja'), TOOL_USE);
    const bundle = await loadModelBundle({ dir });
    expect(bundle.template.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: false, tools: [bashTool] })).toContain('TOOL-USE');
    expect(bundle.template.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: false })).toBe('<|im_start|>user\nhi<|im_end|>\n');
    // Without chat_template.jinja there is no "default" (template files override the config's templates).
    const alone = modelCopy('qwen3');
    mkdirSync(join(alone, 'additional_chat_templates'));
    writeFileSync(join(alone, 'additional_chat_templates', 'tool_use.jinja'), TOOL_USE);
    await expect(loadModelBundle({ dir: alone })).rejects.toMatchObject({ code: 'failed_precondition', message: expect.stringContaining('tool_use.jinja') });
  });

  it('are overridden by chat_template.jinja, as in transformers', async () => {
    const dir = modelCopy('qwen3', { jinja: '{% for m in messages %}[{{ m.content }}]{% endfor %}', config: (c) => void (c.chat_template = [{ name: 'default', template: DEFAULT }, { name: 'tool_use', template: TOOL_USE }]) });
    const bundle = await loadModelBundle({ dir });
    expect(bundle.template.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: false, tools: [bashTool] })).not.toContain('TOOL-USE');
  });
});

describe("a model's own vocabulary (config.json vocab_size)", () => {
  /** A Qwen3 folder with a config.json holding `config`. */
  function withConfig(config: unknown): string {
    const dir = modelCopy('qwen3');
    writeFileSync(join(dir, 'config.json'), typeof config === 'string' ? config : JSON.stringify(config));
    return dir;
  }

  it('widens the ids a model can sample past the tokenizer\u2019s (Qwen3: 151,936 rows, 151,669 ids), on token threads too', async () => {
    const bundle = await loadModelBundle({ dir: withConfig({ architectures: ['Qwen3ForCausalLM'], vocab_size: 151_936 }) });
    expect(bundle.tokenizer.vocabSize).toBe(151_669);
    expect(bundle.tokenizer.modelVocabSize).toBe(151_936);
    expect(vocabSize(bundle.tokenizer)).toBe(151_936);
    // A padding row decodes to nothing, as it does in the engine's detokenizer.
    expect(bundle.tokenizer.decode([151_900])).toBe('');
    const thread = modelBundleFromContents(loadedModelContents(bundle.dir)!);
    expect(thread.tokenizer.modelVocabSize).toBe(151_936);
  });

  it('reads a composite config\u2019s text_config (Gemma 3: 262,208 rows)', async () => {
    const bundle = await loadModelBundle({ dir: withConfig({ model_type: 'gemma3', text_config: { vocab_size: 262_208 }, vision_config: {} }) });
    expect(bundle.tokenizer.modelVocabSize).toBe(262_208);
  });

  it('never narrows below the tokenizer\u2019s ids, and is the tokenizer\u2019s without config.json or the field', async () => {
    expect((await loadModelBundle({ dir: withConfig({ vocab_size: 1000 }) })).tokenizer.modelVocabSize).toBe(151_669);
    expect((await loadModelBundle({ dir: withConfig({ hidden_size: 64 }) })).tokenizer.modelVocabSize).toBe(151_669);
    expect((await loadModelBundle({ dir: modelCopy('qwen3') })).tokenizer.modelVocabSize).toBe(151_669);
  });

  it('is refused at start-up when it is not a vocabulary size, naming the file and field (failed_precondition)', async () => {
    for (const [config, field] of [
      [{ vocab_size: '151936' }, 'vocab_size'],
      [{ vocab_size: -1 }, 'vocab_size'],
      [{ vocab_size: 1.5 }, 'vocab_size'],
      [{ vocab_size: 2 ** 40 }, 'vocab_size'],
      [{ text_config: { vocab_size: true } }, 'text_config.vocab_size'],
    ] as const) {
      const dir = withConfig(config);
      await expect(loadModelBundle({ dir }), JSON.stringify(config)).rejects.toMatchObject({ code: 'failed_precondition', message: expect.stringContaining(`${join(dir, 'config.json')}: ${field} must be an integer`) });
    }
    const dir = withConfig('{ not json');
    await expect(loadModelBundle({ dir })).rejects.toMatchObject({ code: 'failed_precondition', message: `invalid model file ${join(dir, 'config.json')}` });
  });
});

describe('tokenizer.json with an added token id no vocabulary has', () => {
  it('is refused at start-up naming the token and id (failed_precondition), not a RangeError or a silently dropped token', async () => {
    for (const id of [2 ** 24, 2 ** 31, 2 ** 40, -3, 1.5, '7']) {
      const dir = modelCopy('qwen3');
      const path = join(dir, 'tokenizer.json');
      const json = JSON.parse(readFileSync(path, 'utf8')) as { added_tokens: Record<string, unknown>[] };
      json.added_tokens.push({ id, content: '<|absurd|>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
      writeFileSync(path, JSON.stringify(json));
      await expect(loadModelBundle({ dir }), String(id)).rejects.toMatchObject({ code: 'failed_precondition', message: `tokenizer.json: added token "<|absurd|>" has id ${String(id)}, not an integer in [0, 16777216)` });
    }
  });
});
