import { createHash } from 'node:crypto';
import { attachedIdsJson, attachIdsJson } from '../backends/prompt-json.js';
import type { TokenIds } from '../backends/types.js';
import { attachedVarints, attachVarints } from './packed-varints.js';
import { LRUCache } from 'lru-cache';
import { RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import { raceAbort } from '../pipeline/rx.js';
import type { ModelBundleOptions } from './model-bundle.js';
import type { ModelFileContents } from './model-files.js';
import { TokenPool } from './token-pool.js';
import { escapeTools } from './opaque-content.js';
import { environmentIds, promptIds, taskChars, unpackIds, type EnvironmentTask, type TokenTask, type TokenTaskResult } from './token-tasks.js';
import { rememberSuffixLocality } from './suffix-delta.js';
import { templateClockMs } from './chat-template.js';
import { loadedModelContents, qwen3ModelDir } from './tokenizer.js';
import { toolsKey } from './tools-key.js';
import type { ChatMessage, ChatTemplate, Tokenizer, ToolSchema } from './types.js';

/** Options of {@link TokenWork}. */
export interface TokenWorkOptions {
  tokenizer: Tokenizer;
  template: ChatTemplate;
  /** Threads holding the same tokenizer and template (token-worker.ts); without one, all work is inline. */
  pool?: TokenPool<TokenTask, TokenTaskResult>;
  /**
   * Tasks that render and encode at most this many characters run on the event loop: a worker round trip costs
   * more than they do (~0.5-1 µs of CPU per character: 2,048 characters ≈ 1-2 ms). Default 2,048.
   */
  inlineMaxChars?: number;
  /** Most bytes of first prompts kept (keys and ids) for the samples announced to ask for them (see promptIds). */
  promptCacheBytes?: number;
}

const DEFAULT_INLINE_MAX_CHARS = 2048;
const DEFAULT_PROMPT_CACHE_BYTES = 64 << 20;

/**
 * Where a trajectory's token work runs: inline when small, on the token pool when large (see
 * {@link TokenWorkOptions.inlineMaxChars}), so a 64K-token prompt or a conversation a non-local template must
 * render in full never blocks the event loop that serves gRPC and the engines. Where a task ran never changes a
 * token: both run token-tasks.ts on the same tokenizer and template.
 *
 * First prompts are cached by content (messages and tools) for as many later askers as announced: the admission
 * check (validate-task.ts) renders and encodes a task's prompt once and keeps it for the task's samples, whose
 * ledgers take it from the cache; the entry goes with the last of them (or, unclaimed, with the oldest entries past
 * {@link TokenWorkOptions.promptCacheBytes}). So a finished task leaves nothing behind.
 */
export class TokenWork {
  readonly tokenizer: Tokenizer;
  readonly template: ChatTemplate;
  readonly #pool: TokenPool<TokenTask, TokenTaskResult> | undefined;
  readonly #inlineMaxChars: number;
  /** Least recently used first out past the byte bound (lru-cache: a Map's delete-and-set on every hit is O(size) in V8, see tokenizer.ts). */
  readonly #prompts: LRUCache<string, { ids: TokenIds; uses: number }>;
  readonly #pending = new Map<string, PendingPrompt>();
  #keysComputed = 0;
  /**
   * Long prompts' keys by the hint their callers gave (see #keyOf), until their announced askers have come. Bounded by
   * the characters of the messages they keep: a task whose samples never reach a ledger (every init failed) must not
   * keep its prompt's text for as long as the task store keeps the task.
   */
  readonly #keysByHint = new LRUCache<object, HintedKey>({ maxSize: MAX_HINTED_PROMPT_CHARS, sizeCalculation: ({ chars }) => chars });

  constructor(options: TokenWorkOptions) {
    this.tokenizer = options.tokenizer;
    this.template = options.template;
    this.#pool = options.pool;
    this.#inlineMaxChars = options.inlineMaxChars ?? DEFAULT_INLINE_MAX_CHARS;
    const bytes = options.promptCacheBytes ?? DEFAULT_PROMPT_CACHE_BYTES;
    // One huge prompt must not evict everything else either: at most a quarter of the bound per entry. An entry holds
    // the key, the ids and, for a prompt from a token thread, its JSON and varints (attached to the ids, see
    // TokenTaskResult.idsJson and .promptVarints).
    this.#prompts = new LRUCache({
      maxSize: bytes,
      maxEntrySize: Math.max(1, Math.floor(bytes / 4)),
      sizeCalculation: ({ ids }, key) =>
        2 * key.length + (Array.isArray(ids) ? 8 : 4) * ids.length + (attachedIdsJson(ids)?.[0]?.length ?? 0) + (attachedVarints(ids)?.length ?? 0) + 64,
    });
  }

  /** The shared inline instance of a tokenizer and template (what a ledger built without a TokenWork uses). */
  static inline(tokenizer: Tokenizer, template: ChatTemplate): TokenWork {
    let byTokenizer = inlineInstances.get(template);
    if (!byTokenizer) inlineInstances.set(template, (byTokenizer = new WeakMap()));
    let work = byTokenizer.get(tokenizer);
    if (!work) byTokenizer.set(tokenizer, (work = new TokenWork({ tokenizer, template })));
    return work;
  }

  /**
   * The ids of the first prompt (escaped messages rendered with the generation prompt, see token-tasks.ts), on a
   * worker when large: a number[], or for a prompt a token thread sent packed (TokenTaskResult.packedIds) the
   * Int32Array it came in — no 55K-element number[] is built on the event loop for a 64K-token prompt (~0.3-0.7 ms,
   * mostly page faults of a fresh 440 KB array, and a large object on the V8 heap for as long as the prompt is
   * kept); the ledger copies it into its column with one `set` and the trajectory makes a number[] of it only if
   * its prompt_token_ids field is read (pipeline/lazy-prompt.ts). Shared with every caller asking for the same
   * prompt: read-only (not frozen, which would make V8 copy and serialize it several times slower). `keepFor`: how many later calls will ask for
   * this prompt (a task's samples); it is kept for them. Concurrent calls for one prompt share one computation; each
   * caller may give up alone (its `signal`), and the computation stops once all of them have.
   */
  async promptIds(
    messages: readonly ChatMessage[],
    tools: readonly ToolSchema[] | undefined,
    signal?: AbortSignal,
    keepFor = 0,
    keyHint?: object,
  ): Promise<TokenIds> {
    // Tool schemas are escaped here, once for inline and thread work alike (see escapeTools), and keyed escaped.
    tools = escapeTools(this.tokenizer, tools);
    const key = this.#keyOf(messages, tools, keyHint, keepFor);
    const hit = this.#cached(key, keepFor);
    if (hit) return hit;
    let pending = this.#pending.get(key);
    if (!pending) {
      const task: TokenTask = { kind: 'prompt', messages, tools };
      // Shared by every asker until it ends: run under a signal of its own that fires only once all of them gave up
      // (the first asker's signal would have failed the others as cancelled, and ignored theirs).
      const controller = new AbortController();
      const promise = this.#run(task, controller.signal).then((r) => this.#remember(key, r.idsJson === undefined ? r.ids : attachIdsJson(r.ids, [r.idsJson]), keepFor));
      const entry: PendingPrompt = { promise, controller, askers: 0 };
      pending = entry;
      this.#pending.set(key, entry);
      const forget = (): void => {
        if (this.#pending.get(key) === entry) this.#pending.delete(key);
      };
      promise.then(forget, forget);
    }
    return this.#join(key, pending, signal);
  }

  /** One asker's share of a pending prompt: it may give up alone; the last to give up stops the computation. */
  #join(key: string, entry: PendingPrompt, signal: AbortSignal | undefined): Promise<TokenIds> {
    if (signal?.aborted) return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
    entry.askers++;
    if (!signal) return entry.promise;
    const onAbort = (): void => {
      if (--entry.askers > 0) return;
      // Nobody waits any more: a later asker starts afresh rather than joining a computation being stopped.
      if (this.#pending.get(key) === entry) this.#pending.delete(key);
      entry.controller.abort(signal.reason);
    };
    signal.addEventListener('abort', onAbort, { once: true });
    const off = (): void => signal.removeEventListener('abort', onAbort);
    entry.promise.then(off, off);
    return raceAbort(entry.promise, signal);
  }

  /** {@link promptIds} on the event loop, whatever its size (the synchronous TokenLedger constructor). */
  promptIdsSync(messages: readonly ChatMessage[], tools: readonly ToolSchema[] | undefined): TokenIds {
    tools = escapeTools(this.tokenizer, tools);
    const key = this.#computeKey(messages, tools);
    return this.#cached(key, 0) ?? promptIds(this.tokenizer, this.template, { messages, tools });
  }

  /** Prompt cache keys computed so far: each a serialization (and, when long, a digest) of a whole prompt (for tests). */
  get promptKeysComputed(): number {
    return this.#keysComputed;
  }

  /** Prompts kept for announced askers, and their bytes (for tests and metrics). */
  get promptCache(): { entries: number; bytes: number } {
    return { entries: this.#prompts.size, bytes: this.#prompts.calculatedSize };
  }

  /** The ids after an assistant turn (token-tasks.ts environmentIds), on a worker when large. */
  async environmentIds(task: Omit<EnvironmentTask, 'kind'>, signal?: AbortSignal): Promise<Required<Pick<TokenTaskResult, 'ids' | 'method'>>> {
    const result = await this.#run({ kind: 'environment', ...task, tools: escapeTools(this.tokenizer, task.tools) }, signal);
    if (result.method === undefined) throw new RolloutError('internal', 'token worker answered an environment task without its method');
    if (!Array.isArray(result.ids)) throw new RolloutError('internal', 'token worker answered an environment task with packed ids (only a prompt\'s stay packed)');
    return { ids: result.ids as number[], method: result.method };
  }

  /** {@link environmentIds} on the event loop. */
  environmentIdsSync(task: Omit<EnvironmentTask, 'kind'>): Required<Pick<TokenTaskResult, 'ids' | 'method'>> {
    const { ids, method } = environmentIds(this.tokenizer, this.template, { ...task, tools: escapeTools(this.tokenizer, task.tools) });
    return { ids, method };
  }

  async #run(task: TokenTask, signal: AbortSignal | undefined): Promise<RunResult> {
    if (!this.#pool || taskChars(this.template, task) <= this.#inlineMaxChars) {
      return task.kind === 'prompt' ? { ids: promptIds(this.tokenizer, this.template, task) } : environmentIds(this.tokenizer, this.template, task);
    }
    const answer = await this.#pool.run(task, signal);
    // A prompt's packed ids stay packed (see promptIds); an environment delta's become a number[] again.
    const result: RunResult = task.kind === 'prompt' ? keepPacked(answer) : unpackIds(answer);
    if (result.promptVarints !== undefined) attachVarints(result.ids, result.promptVarints);
    // The thread's probe, kept here: the next turns with these tools can run inline without probing (an inline turn
    // probed here already).
    if (task.kind === 'environment' && result.locality !== undefined) rememberSuffixLocality(this.template, task.tools, result.locality);
    return result;
  }

  /**
   * The prompt's cache key, computed once per `hint` (any object the callers asking for one prompt share, e.g. the
   * task, whose admission check announces its samples' ledgers as `keepFor` later askers): a later call with the
   * same hint and the same messages and tools — compared field by field, which for the same strings is a pointer
   * comparison — reuses it instead of serializing and hashing the prompt again (JSON and SHA-256 of 86 KB for a
   * 64K-token prompt, ~0.3 ms and as much garbage). Only for prompts of more than MAX_RAW_PROMPT_KEY characters: a
   * shorter one's key is (about) its JSON, cheaper to make again than to keep. Kept for the askers announced, like the prompt itself; other messages under the
   * same hint get their own key, as without one.
   */
  #keyOf(messages: readonly ChatMessage[], tools: readonly ToolSchema[] | undefined, hint: object | undefined, keepFor: number): string {
    if (hint === undefined) return this.#computeKey(messages, tools);
    const chars = messages.reduce((n, m) => n + m.content.length, 0);
    if (chars <= MAX_RAW_PROMPT_KEY) return this.#computeKey(messages, tools);
    const known = this.#keysByHint.get(hint);
    if (known !== undefined && sameMessages(known.messages, messages) && toolsKey(known.tools) === toolsKey(tools)) {
      if (usedUp(known, keepFor)) this.#keysByHint.delete(hint);
      return known.key;
    }
    const key = this.#computeKey(messages, tools);
    if (keepFor > 0) this.#keysByHint.set(hint, { messages: messages.map((m) => ({ ...m })), tools, key, uses: keepFor, chars });
    return key;
  }

  #computeKey(messages: readonly ChatMessage[], tools: readonly ToolSchema[] | undefined): string {
    this.#keysComputed++;
    return promptKey(messages, tools);
  }

  /** A kept prompt, one use of it taken (it goes with its last); `keepFor` more announced. */
  #cached(key: string, keepFor: number): TokenIds | undefined {
    const hit = this.#prompts.get(key);
    if (!hit) return undefined;
    if (usedUp(hit, keepFor)) this.#prompts.delete(key);
    return hit.ids;
  }

  #remember(key: string, ids: TokenIds, keepFor: number): TokenIds {
    const old = this.#prompts.get(key);
    if (old) {
      old.uses += keepFor;
      return old.ids;
    }
    // Kept only for askers announced (keepFor), none otherwise.
    if (keepFor > 0) this.#prompts.set(key, { ids, uses: keepFor });
    return ids;
  }
}

/**
 * A pool of token threads for a model folder the server has loaded (loadModelBundle(model), awaited first): each
 * thread builds its bundle from the files as the server read them (loadedModelContents; see TokenThreadModel),
 * with the same template variables and parser, so its tokenizer and adapted template are the server's. Threads
 * start with the first large task and again after every crash, possibly hours later: reading the folder then
 * would tokenize with whatever it holds by that time (a checkpoint saved into it, a newer template) or fail if it
 * is gone. `failed_precondition` when the folder was not loaded.
 */
export function createTokenPool(
  model: ModelBundleOptions,
  options: { size?: number; maxQueued?: number; taskTimeoutMs?: number; abandonedTaskGraceMs?: number; logger?: Logger; script?: URL } = {},
): TokenPool<TokenTask, TokenTaskResult> {
  const { dir = qwen3ModelDir(), templateVariables, toolCallParser } = model;
  const contents = loadedModelContents(dir);
  if (contents === undefined) throw new RolloutError('failed_precondition', `token threads for ${dir}: load the model (loadModelBundle) before starting its threads`);
  const workerData: TokenThreadModel = {
    contents,
    templateClockMs: templateClockMs(),
    ...(templateVariables !== undefined && { templateVariables }),
    ...(toolCallParser !== undefined && { toolCallParser }),
  };
  return new TokenPool<TokenTask, TokenTaskResult>({ script: TOKEN_WORKER_ENTRY, workerData, ...options });
}

/** What a token thread gets as `workerData` (structured clone): the model files the server read, and how it built its bundle. */
export interface TokenThreadModel extends Omit<ModelBundleOptions, 'dir'> {
  contents: ModelFileContents;
  /** The server's template clock (chat-template.ts templateClockMs): the thread's renders print the server's date. */
  templateClockMs?: number;
}

const TOKEN_WORKER_ENTRY = new URL('./token-worker-entry.mjs', import.meta.url);

const inlineInstances = new WeakMap<ChatTemplate, WeakMap<Tokenizer, TokenWork>>();

/**
 * The cache key of a prompt: its messages and tools, exactly, so equal keys render to equal text. A short prompt's
 * JSON is its own key (hashing it cost more than the lookup: every task's prompt is keyed twice, at admission and by
 * each sample's ledger); a longer one is keyed by a SHA-256 of its fields, each length-prefixed, the contents hashed as
 * their UTF-16 code units: a long prompt's key was a second copy of its text (86 KB for a 64K-token prompt) kept for as
 * long as the prompt waited for its samples, and later a JSON of it made only to be hashed — a string of that size per
 * prompt, which the main isolate's collector then moved (BENCH_HEAP_SAMPLE on the 64K pass: ~100 KB surviving per
 * trajectory). Code units, not UTF-8: two contents that differ only in a lone surrogate would have the same UTF-8 (both
 * become U+FFFD) and must not share a key. A raw key holds a NUL, a digest ("#" and base64) none: never equal.
 */
export function promptKey(messages: readonly ChatMessage[], tools: readonly ToolSchema[] | undefined): string {
  const tk = toolsKey(tools);
  if (messages.reduce((n, m) => n + m.content.length, 0) <= MAX_RAW_PROMPT_KEY) {
    const json = JSON.stringify(messages.map((m) => (m.name === undefined ? [m.role, m.content] : [m.role, m.content, m.name])));
    if (json.length <= MAX_RAW_PROMPT_KEY) return `${tk}\u0000${json}`;
  }
  const hash = createHash('sha256').update(`${tk.length}:${tk}|${messages.length}|`, 'utf16le');
  for (const m of messages) {
    const name = m.name === undefined ? '-' : `${m.name.length}:${m.name}`;
    hash.update(`${m.role.length}:${m.role}|${name}|${m.content.length}:`, 'utf16le').update(m.content, 'utf16le');
  }
  return `#${hash.digest('base64')}`;
}

/** A token task's result as TokenWork hands it on: a prompt's ids may be the Int32Array a token thread sent. */
type RunResult = Omit<TokenTaskResult, 'ids' | 'packedIds'> & { ids: TokenIds };

/** A token thread's answer with its packed ids (if it packed them) as the ids: no number[] is built. */
function keepPacked(result: TokenTaskResult): RunResult {
  const { packedIds, ...rest } = result;
  return packedIds === undefined ? rest : { ...rest, ids: packedIds };
}

/** A first prompt being computed, shared by its askers (see TokenWork.promptIds). */
interface PendingPrompt {
  promise: Promise<TokenIds>;
  /** Stops the computation (its token thread's task) once every asker gave up. */
  controller: AbortController;
  /** Askers still waiting for it (one without a signal never leaves). */
  askers: number;
}

/** A long prompt's key kept for the askers its hint announced (see TokenWork.#keyOf). */
interface HintedKey {
  messages: readonly ChatMessage[];
  tools: readonly ToolSchema[] | undefined;
  key: string;
  uses: number;
  /** Characters of the messages' contents: what keeping them costs. */
  chars: number;
}

/** Most characters of messages kept with hinted prompt keys (see TokenWork.#keysByHint): 32 MB of UTF-16 at most. */
const MAX_HINTED_PROMPT_CHARS = 16 << 20;

/** Takes one use of a kept entry and announces `keepFor` more; whether it is used up (to be dropped). */
function usedUp(entry: { uses: number }, keepFor: number): boolean {
  entry.uses += keepFor - 1;
  return entry.uses <= 0;
}

/** Whether two message lists are equal in what a prompt key holds (role, content, name). */
function sameMessages(a: readonly ChatMessage[], b: readonly ChatMessage[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) {
    const x = a[i]!;
    const y = b[i]!;
    if (x.role !== y.role || x.content !== y.content || x.name !== y.name) return false;
  }
  return true;
}

/** Prompt JSON of at most this many characters is its own cache key (see promptKey). */
export const MAX_RAW_PROMPT_KEY = 1024;
