import { randomInt } from 'node:crypto';
import type { CustomBatchingPrioritizationStrategy, LlamaContext, LlamaContextSequence, LlamaModel, Token } from 'node-llama-cpp';
import { RolloutError } from '../../errors.js';
import { ContextOverflowError } from '../context-overflow.js';
import type { EngineClient, EngineModelInfo, EngineServerInfo, GenerateRequest, GenerateResult, PauseMode } from '../types.js';
import { parseEmbeddedUrl, type EmbeddedModelSpec } from './embedded-url.js';
import { GenerationControl, type ControlledGeneration } from './generation-control.js';
import { loadLlamaRuntime } from './llama-runtime.js';
import { SequenceSlots } from './sequence-slots.js';
import { ensureTinyQwen3Gguf } from './tiny-qwen3.js';

/** How one embedded engine runs its model. */
export interface EmbeddedEngineOptions {
  /** The backend URL (see parseEmbeddedUrl): which GGUF, context size, threads, sequences. */
  url: string;
  /** Sequences when the URL does not say: the backend's max concurrency, capped at {@link MAX_DEFAULT_SEQUENCES}. */
  maxConcurrency?: number;
}

/** Context length of a sequence when the URL does not say (clamped to what the model was trained for). */
export const DEFAULT_CONTEXT_SIZE = 4096;
/**
 * Sequences allocated when the URL does not say `sequences`: a backend's max concurrency defaults to 256 (sized for
 * vLLM), and each sequence holds a KV cache of the full context, so more than this on a CPU is memory for nothing.
 * Requests beyond the sequences queue.
 */
export const MAX_DEFAULT_SEQUENCES = 4;
/** A model that failed to load is tried again after 1 s, then 2, 4, ... at most 30 s after each failure. */
const LOAD_RETRY_FIRST_MS = 1_000;
const LOAD_RETRY_MAX_MS = 30_000;

interface Loaded {
  model: LlamaModel;
  context: LlamaContext;
  slots: SequenceSlots<LlamaContextSequence>;
  vocabSize: number;
}

/**
 * An engine inside the server process: llama.cpp (node-llama-cpp, prebuilt, CPU) running a GGUF, for local runs
 * and tests without a GPU server. One model and one context with N sequences; requests beyond N wait in FIFO order.
 * Token in, token out, like the vLLM client: the prompt is evaluated as the given ids (never re-tokenized) on a
 * cleared sequence, and each llama.cpp batch holds one sequence's tokens only (see {@link oneSequencePerBatch}), so
 * the same seed and prompt give the same ids and logprobs whatever ran before and whatever runs in the other
 * sequences meanwhile.
 *
 * Sampling is llama.cpp's chain top-k → top-p → temperature → seeded draw (note: top-k/top-p cut on the
 * untempered logits, vLLM cuts after temperature; identical when either is off). Defaults follow vLLM: temperature
 * 1, no top-k, top-p 1, a fresh random seed when none is given. Each token's logprob is log of node-llama-cpp's
 * `confidence`: the probability of the sampled token under the distribution it was drawn from — softmax of the
 * tempered logits over the candidates left by top-k/top-p — i.e. vLLM's processed_logprobs, which PPO-style ratios
 * need. With temperature 0 (greedy) it is the untempered softmax.
 *
 * Finish: EOS/EOT (any end-of-generation token, kept as the last id, `stop`), a stop string (ids up to and
 * including the token that completed it, text cut before it, `stop`), or max_tokens (`length`). A prompt plus
 * max_tokens beyond the context is a {@link ContextOverflowError}, as vLLM's 400 is, so llama.cpp never shifts the
 * context under a trajectory. Inference runs on llama.cpp's native threads; the event loop only sees one small
 * callback per token. An abort of the request's signal stops generation after the token in flight.
 *
 * Control, as vLLM's dev-mode routes: {@link abort} by request id or all (the generation ends after its current
 * token with finish "abort" and what it sampled; a request still waiting for a sequence or held by a pause answers
 * "abort" with no tokens), {@link pause} in abort, wait or keep mode (keep freezes running generations between two
 * tokens, their sequences kept) and {@link resume}; while paused, new requests wait.
 *
 * The model loads in the background from construction; `generate`, `modelInfo` and `health` wait for it (no longer
 * than their signal allows), and health is true exactly while it is loaded. A load that fails (the file not there yet,
 * or not loadable) is tried again by the next of those calls once a backoff has passed (1 s doubling to 30 s), so the
 * pool's health probes bring the engine up when its model becomes loadable. `close()` frees the context and the
 * model.
 *
 * @example
 * const engine = new EmbeddedEngineClient({ url: 'embedded://tiny-qwen3?threads=1' });
 * const out = await engine.generate({ promptIds, maxTokens: 64, temperature: 1, seed: 7, signal });
 */
export class EmbeddedEngineClient implements EngineClient {
  readonly kind = 'embedded' as const;
  readonly url: string;
  readonly #spec: EmbeddedModelSpec;
  /** The current load: in flight, done, or failed (then tried again once {@link #retryAt} has passed). */
  #loaded: Promise<Loaded>;
  /** Consecutive failed loads, and when the next may start (see {@link #current}). */
  #failures = 0;
  #retryAt = 0;
  readonly #sequences: number;
  readonly #control = new GenerationControl();
  #closed = false;
  #disposal: Promise<void> | undefined;

  constructor(options: EmbeddedEngineOptions) {
    this.url = options.url;
    this.#spec = parseEmbeddedUrl(options.url);
    this.#sequences = Math.max(1, this.#spec.sequences ?? Math.min(options.maxConcurrency ?? 1, MAX_DEFAULT_SEQUENCES));
    this.#loaded = this.#attempt();
  }

  /** Resolves once the model is loaded (rejects with backend_error when it cannot be, now). */
  async ready(): Promise<void> {
    await this.#current();
  }

  /** One load, whose failure is counted and schedules the next attempt (backoff doubling from 1 s, at most 30 s). */
  #attempt(): Promise<Loaded> {
    const attempt = this.#load(this.#sequences).then(
      (loaded) => {
        this.#failures = 0;
        return loaded;
      },
      (err: unknown) => {
        this.#failures++;
        this.#retryAt = performance.now() + Math.min(LOAD_RETRY_FIRST_MS * 2 ** (this.#failures - 1), LOAD_RETRY_MAX_MS);
        throw err;
      },
    );
    attempt.catch(() => undefined); // surfaced by generate/health/modelInfo, never as an unhandled rejection
    return attempt;
  }

  /**
   * The load to wait for: the one in flight or done, or — when the last one failed and its backoff has passed — a new
   * one. A model that could not be loaded when the engine was created (its file not there yet: still being copied, a
   * file system not mounted) is loaded once it can be, on the next health probe or request, instead of never.
   */
  #current(): Promise<Loaded> {
    if (this.#failures > 0 && !this.#closed && performance.now() >= this.#retryAt) {
      // Marks the attempt as under way (the next failure sets a new time), so concurrent callers share it.
      this.#retryAt = Infinity;
      this.#loaded = this.#attempt();
    }
    return this.#loaded;
  }

  async #load(sequences: number): Promise<Loaded> {
    const spec = this.#spec;
    const path = spec.model.kind === 'file' ? spec.model.path : await ensureTinyQwen3Gguf();
    try {
      const llama = await loadLlamaRuntime();
      const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
      try {
        const contextSize = Math.min(spec.contextSize ?? DEFAULT_CONTEXT_SIZE, model.trainContextSize);
        const context = await model.createContext({
          contextSize,
          sequences,
          threads: spec.threads,
          batchSize: Math.min(512, contextSize),
          batching: { itemPrioritizationStrategy: oneSequencePerBatch() },
        });
        const slots = new SequenceSlots(Array.from({ length: sequences }, () => context.getSequence()));
        const vocabSize = model.fileInfo.metadata.tokenizer?.ggml?.tokens?.length ?? Number.MAX_SAFE_INTEGER;
        if (this.#closed) {
          await context.dispose();
          throw new Error('closed while loading');
        }
        return { model, context, slots, vocabSize };
      } catch (err) {
        await model.dispose();
        throw err;
      }
    } catch (err) {
      throw new RolloutError('backend_error', `embedded engine ${this.url}: cannot load ${path}`, { cause: err });
    }
  }

  async generate(request: GenerateRequest): Promise<GenerateResult> {
    const { signal } = request;
    // Known to the control from arrival, so that an abort (by id, all, or a pause in abort mode) also ends the
    // request while it waits for the model, at the pause gate or for a sequence.
    const generation = this.#control.begin(request.requestId);
    try {
      let loaded: Loaded;
      let sequence: LlamaContextSequence;
      try {
        const waiting = AbortSignal.any([signal, generation.stopped]);
        loaded = await this.#whenLoaded(waiting);
        this.#check(request, loaded.context, loaded.vocabSize);
        sequence = await this.#sequence(loaded.slots, waiting);
      } catch (err) {
        // Aborted before it had a sequence: it answers as every aborted request does, with what it sampled (nothing).
        if (generation.aborted && !signal.aborted) return { tokenIds: [], logprobs: [], finishReason: 'abort', text: '' };
        throw err;
      }
      this.#control.start(generation);
      try {
        const { model, vocabSize } = loaded;
        return await this.#sample(model, sequence, request, Math.min(vocabSize, request.vocabSize ?? vocabSize), generation);
      } catch (err) {
        throw this.#failure(err, signal);
      } finally {
        loaded.slots.release(sequence);
      }
    } finally {
      this.#control.end(generation);
    }
  }

  /** Refuses a request the engine cannot run: closed, empty or out-of-vocabulary prompt, max_tokens < 1, context overflow. */
  #check(request: GenerateRequest, context: LlamaContext, vocabSize: number): void {
    const { promptIds, maxTokens } = request;
    if (this.#closed) throw new RolloutError('backend_error', `embedded engine ${this.url} is closed`);
    if (promptIds.length === 0) throw new RolloutError('backend_error', `embedded engine ${this.url}: empty prompt`);
    // vLLM answers 400 to this; without the check llama.cpp would be asked for nothing and answer an empty "length".
    if (!Number.isInteger(maxTokens) || maxTokens < 1) throw new RolloutError('backend_error', `embedded engine ${this.url}: max_tokens must be a positive integer, not ${maxTokens}`);
    for (const id of promptIds) {
      if (!Number.isInteger(id) || id < 0 || id >= vocabSize) throw new RolloutError('backend_error', `embedded engine ${this.url}: prompt id ${id} is outside the model's vocabulary`);
    }
    if (promptIds.length + maxTokens > context.contextSize) {
      throw new ContextOverflowError(
        context.contextSize,
        promptIds.length,
        `embedded engine ${this.url}: ${promptIds.length} context + ${maxTokens} max_tokens exceed the context size ${context.contextSize}`,
      );
    }
  }

  /**
   * What a generation that failed under way answers: its own RolloutError (an abort's reason, a refused id, the
   * engine closing between two tokens) as it is, and anything node-llama-cpp threw — its DisposedError when close()
   * disposed the context under a token queued for evaluation, a native failure — as backend_error naming the engine,
   * the error as its cause.
   */
  #failure(err: unknown, signal: AbortSignal): RolloutError {
    if (err instanceof RolloutError) return err;
    if (signal.aborted) return RolloutError.from(signal.reason, 'cancelled');
    const message = err instanceof Error ? err.message : String(err);
    return new RolloutError('backend_error', `embedded engine ${this.url}${this.#closed ? ' closed while generating' : ''}: ${message}`, { cause: err });
  }

  /** A sequence, once the engine is not paused: waits before taking one, and again if a pause began meanwhile. */
  async #sequence(slots: SequenceSlots<LlamaContextSequence>, signal: AbortSignal): Promise<LlamaContextSequence> {
    for (;;) {
      await this.#control.admit(signal);
      const sequence = await slots.acquire(signal);
      if (!this.#control.paused) return sequence;
      slots.release(sequence);
    }
  }

  /**
   * The loaded model, or the signal's reason (a RolloutError) if it fires first: a caller with a budget (a health
   * probe, a request) never waits a whole load. Without a signal (in-process callers such as tests), waits the load.
   */
  #whenLoaded(signal?: AbortSignal): Promise<Loaded> {
    const loaded = this.#current();
    if (signal === undefined) return loaded;
    if (signal.aborted) return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
    return new Promise<Loaded>((resolve, reject) => {
      const onAbort = (): void => reject(RolloutError.from(signal.reason, 'cancelled'));
      signal.addEventListener('abort', onAbort, { once: true });
      void loaded.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
    });
  }

  /** The generations running now: request id and tokens sampled so far (for statistics and tests). */
  generations(): Array<{ requestId: string | undefined; tokens: number }> {
    return this.#control.running().map((g) => ({ requestId: g.requestId, tokens: Math.max(0, g.checkpoints - 1) }));
  }

  /** Aborts generations by GenerateRequest.requestId (unknown ids ignored), or all of them. */
  abort(requestIds: readonly string[] | undefined): Promise<void> {
    this.#control.abort(requestIds);
    return Promise.resolve();
  }

  /** Pauses generation (all three modes, see PauseMode); resolves in wait mode once running generations finished. */
  async pause(mode: PauseMode, signal: AbortSignal): Promise<void> {
    if (mode !== 'abort' && mode !== 'wait' && mode !== 'keep') throw RolloutError.invalid('mode', `unknown pause mode ${String(mode)}`);
    await this.#control.pause(mode, signal);
  }

  resume(): Promise<void> {
    this.#control.resume();
    return Promise.resolve();
  }

  async #sample(model: LlamaModel, sequence: LlamaContextSequence, request: GenerateRequest, vocabSize: number, generation: ControlledGeneration): Promise<GenerateResult> {
    const { signal, maxTokens } = request;
    const tokenIds: number[] = [];
    const logprobs: number[] = [];
    const stops = (request.stop ?? []).filter((s) => s.length > 0);
    // A stop string of L characters ends in the newest token and spans at most ~4(L+1) tokens (a character can be
    // split over up to 4 byte tokens), so only that tail is decoded per token.
    const window = stops.length === 0 ? 0 : 4 * (Math.max(...stops.map((s) => s.length)) + 1);
    let finishReason: GenerateResult['finishReason'] = 'length';
    let stopString: string | undefined;
    if (signal.aborted) throw RolloutError.from(signal.reason, 'cancelled');
    await sequence.clearHistory();
    if (!(await this.#control.checkpoint(generation, signal))) finishReason = 'abort';
    else if (maxTokens > 0) {
      const options = {
        temperature: request.temperature ?? 1,
        topK: request.topK !== undefined && request.topK > 0 ? request.topK : 0,
        topP: request.topP ?? 1,
        minP: 0,
        seed: request.seed !== undefined ? uint32(request.seed) : randomInt(2 ** 32 - 1),
        yieldEogToken: true,
      };
      for await (const out of sequence.evaluateWithMetadata(promptIds(request), { confidence: true }, options)) {
        if (signal.aborted) break;
        if (!Number.isInteger(out.token) || out.token < 0 || out.token >= vocabSize) {
          throw new RolloutError('backend_error', `embedded engine ${this.url} sampled id ${out.token}, outside the vocabulary`);
        }
        if (!(out.confidence > 0)) throw new RolloutError('backend_error', `embedded engine ${this.url}: no probability for sampled id ${out.token}`);
        tokenIds.push(out.token);
        logprobs.push(Math.min(0, Math.log(out.confidence)));
        if (model.isEogToken(out.token) || request.stopTokenIds?.includes(out.token) === true) {
          finishReason = 'stop';
          break;
        }
        if (window > 0) {
          const tail = model.detokenize(tokenIds.slice(-window) as Token[], true);
          stopString = stops.find((s) => tail.includes(s));
          if (stopString !== undefined) {
            finishReason = 'stop';
            break;
          }
        }
        if (tokenIds.length >= maxTokens) break;
        // Before the next token is evaluated: frozen here by a keep pause, ended here by an abort.
        if (!(await this.#control.checkpoint(generation, signal))) {
          finishReason = 'abort';
          break;
        }
      }
    }
    if (signal.aborted) throw RolloutError.from(signal.reason, 'cancelled');
    let text = model.detokenize(tokenIds as Token[], true);
    if (stopString !== undefined) text = text.slice(0, text.indexOf(stopString));
    return { tokenIds, logprobs, finishReason, text };
  }

  /** True while the model is loaded and the engine not closed. */
  async health(signal: AbortSignal): Promise<boolean> {
    if (signal.aborted || this.#closed) return false;
    try {
      await this.#whenLoaded(signal);
      return !this.#closed;
    } catch {
      return false;
    }
  }

  /**
   * The context size of one sequence: prompt + generated tokens of one request. While the model loads, a signal that
   * fires first rejects with its reason (a RolloutError), as a request to a remote engine would.
   */
  async modelInfo(signal?: AbortSignal): Promise<EngineModelInfo> {
    const { context } = await this.#whenLoaded(signal);
    return { maxModelLen: context.contextSize };
  }

  /**
   * Its sequences (requests decoded at once) and its logprobs, which are always those of the distribution each
   * token was drawn from (log of node-llama-cpp's confidence, see the class): `processed`.
   */
  async serverInfo(): Promise<EngineServerInfo> {
    return { logprobsMode: 'processed', maxConcurrency: this.#sequences };
  }

  /**
   * Frees the context and the model (once loaded); requests waiting for a sequence or held by a pause, and
   * generations frozen by a keep pause, fail with backend_error.
   */
  close(): void {
    void this.closed();
  }

  /** Like close(), and resolves once the model's native memory is freed (tests, orderly shutdown). */
  closed(): Promise<void> {
    this.#closed = true;
    this.#control.close();
    this.#disposal ??= this.#loaded.then(
      async ({ context, model, slots }) => {
        slots.close();
        await context.dispose();
        await model.dispose();
      },
      () => undefined, // never loaded: nothing to free
    );
    return this.#disposal;
  }
}

/**
 * Which queued evaluation goes into the next llama.cpp batch: one sequence's only, as much of it as fits. llama.cpp's
 * CPU kernels round differently for a batch of several rows than for one, so a request decoded in one batch with
 * other sequences' tokens got other logits (and, a few dozen tokens on, other ids) than the same seed and prompt alone.
 * One sequence per batch keeps each request's every batch exactly what it would be alone (its prompt in the same
 * chunks of at most `size`, then one token per batch): a seeded request gives the same ids and logprobs whatever runs
 * in the other sequences. The queued sequences take turns batch by batch, so a long prompt being evaluated does not
 * hold back the tokens of the others (it gets every n-th batch). The cost is the batching of decoding several
 * sequences at once (weights read once per token of all of them; their sampling in parallel): the throughput of
 * several sequences on a CPU.
 */
function oneSequencePerBatch(): CustomBatchingPrioritizationStrategy {
  let turn = 0;
  return ({ items, size }) => {
    if (items.length === 0) return [];
    const item = items[turn++ % items.length]!;
    return [{ item, processAmount: Math.min(item.tokens.length, size) }];
  };
}

/** The prompt as node-llama-cpp's token type (a branded number): the very ids given, copied. */
function promptIds(request: GenerateRequest): Token[] {
  return Array.from(request.promptIds) as Token[];
}

/**
 * llama.cpp seeds are uint32: any integer seed maps to one, deterministically (vLLM takes any int). 0xFFFFFFFF is
 * llama.cpp's LLAMA_DEFAULT_SEED, "draw a random seed": a seed landing there (-1, 2^32 - 1, ...) would sample
 * irreproducibly, so it moves to 0xFFFFFFFE.
 */
function uint32(seed: number): number {
  const u = Number(BigInt.asUintN(32, BigInt(Math.trunc(seed))));
  return u === LLAMA_DEFAULT_SEED ? LLAMA_DEFAULT_SEED - 1 : u;
}

const LLAMA_DEFAULT_SEED = 0xffffffff;
