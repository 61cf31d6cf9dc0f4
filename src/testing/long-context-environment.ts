import { z } from 'zod';
import { RolloutError } from '../errors.js';
import type { Environment } from '../environments/types.js';
import type { ChatMessage } from '../tokens/types.js';
import { defineTool, type ValidatedTool } from '../tools/define-tool.js';
import { seededRandom } from './arithmetic.js';
import { hermesToolCall, type FakePolicy } from './scripted-policy.js';

/** Name under which {@link createLongContextEnvironment} registers. */
export const LONG_CONTEXT_ENVIRONMENT = 'bench-long-context';

/** An instance: a log of `promptChars` characters in the prompt, then `pages` pages of `pageChars` read by the tool. */
export interface LongContextInstance {
  seed: number;
  promptChars: number;
  pages: number;
  pageChars: number;
}

const instanceSchema = z.strictObject({
  seed: z.number().int().min(0),
  promptChars: z.number().int().min(1).max(4_000_000),
  pages: z.number().int().min(0).max(64),
  pageChars: z.number().int().min(1).max(1_000_000),
});

const LEVELS = ['INFO', 'INFO', 'INFO', 'DEBUG', 'WARN', 'ERROR'] as const;
const WORKERS = ['scheduler', 'fetcher', 'indexer', 'uploader', 'gc', 'auth'] as const;

/**
 * Seeded, varied log lines (timestamps, ids, numbers), `chars` characters long: text that tokenizes like real tool
 * output (Qwen3: ~2.5 characters per token), so "64K tokens" costs what it would with a real log.
 */
export function logText(seed: number, chars: number): string {
  // The server asks for a prompt twice (admission, init): the double's own cost is not what the benchmark measures.
  const key = `${seed}:${chars}`;
  let text = prepared.get(key) ?? recent.get(key);
  if (text === undefined) {
    text = generateLog(seed, chars);
    remember(recent, key, text);
  }
  return text;
}

const recent = new Map<string, string>();

/** Entries the double's memos keep (oldest dropped first). */
const MEMO_SIZE = 64;

/** Sets `key` in a memo, dropping its oldest entry past {@link MEMO_SIZE}. */
function remember<K, V>(memo: Map<K, V>, key: K, value: V): void {
  memo.set(key, value);
  if (memo.size > MEMO_SIZE) memo.delete(memo.keys().next().value!);
}

/** Texts made ahead by {@link prepareLongContext}, kept until {@link forgetPreparedLongContext}. */
const prepared = new Map<string, string>();

/**
 * Generates ahead every text the instances will ask for (the prompt's log and each page), as an environment whose
 * data is already in memory would have them: generating an 86K-character log costs this double 2-3 ms of the event
 * loop per task (timestamps formatted line by line), which is not the server's work. The benchmark calls it before a
 * measured pass, for the instances it is about to submit; {@link logText} then returns the same strings without
 * generating them. Returns the characters prepared.
 */
export function prepareLongContext(instances: readonly LongContextInstance[]): number {
  let chars = 0;
  const keep = (seed: number, length: number): void => {
    const key = `${seed}:${length}`;
    if (!prepared.has(key)) prepared.set(key, generateLog(seed, length));
    chars += length;
  };
  for (const instance of instances) {
    keep(instance.seed, instance.promptChars);
    for (let page = 0; page < instance.pages; page++) keep(pageSeed(instance, page), instance.pageChars);
    const key = promptKeyOf(instance);
    if (!prepared.has(key)) prepared.set(key, buildPromptContent(instance));
  }
  return chars;
}

/**
 * The user message of an instance's prompt: the log and the instruction, as one flat string (prepared ahead with the
 * texts, like a dataset's prompt already in memory). Built by a template literal it was a rope that the server's
 * first read of it (its prompt key, its render) flattened into a fresh 86 KB string on the event loop per task.
 */
function promptContent(instance: LongContextInstance): string {
  return prepared.get(promptKeyOf(instance)) ?? buildPromptContent(instance);
}

function promptKeyOf(instance: LongContextInstance): string {
  return `prompt:${instance.seed}:${instance.promptChars}:${instance.pages}`;
}

function buildPromptContent(instance: LongContextInstance): string {
  // Array#join makes a flat string (a template literal of three parts makes a rope).
  return ['Here is the start of the log:\n', logText(instance.seed, instance.promptChars), `\nRead all ${instance.pages} remaining pages, then say "done".`].join('');
}

/** Drops what {@link prepareLongContext} made. */
export function forgetPreparedLongContext(): void {
  prepared.clear();
}

/** The seed of an instance's page (one text per instance seed and page). */
function pageSeed(instance: LongContextInstance, page: number): number {
  return instance.seed * 1000 + page + 1;
}

function generateLog(seed: number, chars: number): string {
  const random = seededRandom(seed);
  const int = (n: number): number => Math.floor(random() * n);
  const lines: string[] = [];
  let length = 0;
  let ms = 1_764_000_000_000 + int(1e9);
  while (length < chars) {
    ms += int(5000);
    const line =
      `${new Date(ms).toISOString()} ${WORKERS[int(WORKERS.length)]}-${int(16)} ${LEVELS[int(LEVELS.length)]} ` +
      `req=${int(0xffffff).toString(16)} took ${int(900)}ms status=${[200, 200, 201, 404, 500][int(5)]} bytes=${int(100_000)}\n`;
    lines.push(line);
    length += line.length;
  }
  return lines.join('').slice(0, chars);
}

const readPageArgs = z.object({ page: z.number().int().min(0).describe('page number, from 0') });

function readPageTool(instance: LongContextInstance): ValidatedTool {
  return defineTool({
    name: 'read_page',
    description: 'Returns one page of the rest of the log.',
    args: readPageArgs,
    async run({ page }) {
      if (page >= instance.pages) return { output: `Error: there are ${instance.pages} pages`, outcome: 'error' };
      return { output: logText(pageSeed(instance, page), instance.pageChars), outcome: 'ok' };
    },
  });
}

/**
 * TEST DOUBLE environment for the long-context benchmark: the prompt holds a long log and the tool `read_page`
 * returns more of it, so a conversation of tens of thousands of tokens takes environment turns (what used to block
 * the event loop: rendering and tokenizing such contexts). In-process tool (pair it with NullSandboxDriver and
 * {@link longContextPolicy}); reward 1 when the policy reports having read every page. Never registered by
 * `defaultRegistry`.
 */
export function createLongContextEnvironment(): Environment<LongContextInstance> {
  // The admission check (Environment.prompt) and every sample's init ask for the same instance's prompt: built once
  // (a 86K-character log is ~2 ms of the event loop), as an environment reading its prompt from a dataset would, and
  // kept for the MEMO_SIZE most recent instances only. (A memo tied to the instance object, as this was, kept each
  // task's ~86 KB prompt on the server's heap for as long as the task store keeps the finished task: the heap grew by
  // that per long task through the benchmark's pass, which a dataset-backed environment's would not.)
  const prompts = new Map<LongContextInstance, ChatMessage[]>();
  const prompt = (instance: LongContextInstance): ChatMessage[] => {
    let messages = prompts.get(instance);
    if (!messages) {
      messages = [
        { role: 'system', content: 'You read logs with the read_page tool and report what you found.' },
        { role: 'user', content: promptContent(instance) },
      ];
      remember(prompts, instance, messages);
    }
    return messages.map((m) => ({ ...m }));
  };
  // Its tool, too, once per instance (stateless, so its samples share it, as every real environment shares its tools):
  // building one derives its JSON Schema (~0.2 ms), and a new tool list per call is a new cache key for the prompt.
  const toolLists = new WeakMap<LongContextInstance, ValidatedTool[]>();
  const tools = (instance: LongContextInstance): ValidatedTool[] => {
    let list = toolLists.get(instance);
    if (!list) toolLists.set(instance, (list = [readPageTool(instance)]));
    return list;
  };
  return {
    name: LONG_CONTEXT_ENVIRONMENT,
    description: 'Benchmark double: a long log in the prompt, more pages through an in-process tool.',
    instanceSchema: z.toJSONSchema(instanceSchema) as Record<string, unknown>,
    toolNames: ['read_page'],
    validate: (instance) => {
      const result = instanceSchema.safeParse(instance);
      if (result.success) return result.data;
      const issue = result.error.issues[0];
      const path = issue?.path.map(String).join('.') ?? '';
      throw RolloutError.invalid(path === '' ? 'instance' : `instance.${path}`, issue?.message ?? 'invalid');
    },
    prompt,
    async init({ instance }) {
      return { messages: prompt(instance) };
    },
    tools,
    async evaluate({ instance, outcome }) {
      const last = outcome.messages.at(-1);
      const done = last?.role === 'assistant' && last.content.includes(`read ${instance.pages} pages`);
      return { reward: done ? 1 : 0, details: {}, report: {} };
    },
  };
}

/**
 * TEST DOUBLE policy for FakeVllmEngine, made for {@link createLongContextEnvironment}: reads page after page with
 * `read_page` (as many as the prompt asks for), then answers `done: read N pages`.
 */
export const longContextPolicy: FakePolicy = (promptText) => {
  const pages = Number(/Read all (\d+) remaining pages/.exec(promptText)?.[1] ?? 0);
  const read = promptText.split('<tool_response>').length - 1;
  return read < pages ? hermesToolCall('read_page', { page: read }) : `done: read ${pages} pages`;
};
