import { RolloutError } from '../errors.js';
import { EmbeddedEngineClient } from './embedded/embedded-engine.js';
import { parseEmbeddedUrl } from './embedded/embedded-url.js';
import { engineUrlProblem, withoutCredentials } from './engine-http.js';
import { SglangClient } from './sglang-client.js';
import type { EngineClient, PauseMode } from './types.js';
import { VllmClient } from './vllm-client.js';
import type { ResponseBudget } from './response-budget.js';

/** Settings every engine client takes from the server config (or AddBackend). */
export interface EngineClientOptions {
  /** Budget of one generate request. 0 = none. */
  requestTimeoutMs?: number;
  /**
   * How long an answer's body may send nothing once its headers came before the engine counts as lost (see
   * EngineHttpOptions.bodyIdleTimeoutMs). Default DEFAULT_BODY_IDLE_MS (30 s).
   */
  bodyIdleTimeoutMs?: number;
  /** Cap on a generate answer in bytes. 0 = derived per request from prompt length and max_tokens. */
  maxResponseBytes?: number;
  /** The bytes of generate answers buffered at once across engines: the pool's (BackendPool.responseBudget). None: unbounded. */
  responseBudget?: ResponseBudget;
  /**
   * vLLM: refuse a completion whose id is not `cmpl-<its X-Request-Id>` (see VllmClientOptions.checkAnswerId; default
   * off, for gateways that rename answers). SGLang's answers always name their rid and are always checked.
   */
  checkAnswerId?: boolean;
  /** The backend's max concurrency: the embedded engine's sequences when its URL does not say. */
  maxConcurrency?: number;
}

/** What a kind of engine can do beyond generate and health, so callers check before relying on it. */
export interface BackendCapabilities {
  /** Pause modes the engine implements; a pool emulates the others (e.g. drains its own requests for "wait"). */
  readonly pauseModes: readonly PauseMode[];
  /** Whether one request can be aborted by its GenerateRequest.requestId. */
  readonly abortByRequestId: boolean;
  /** Whether the engine states its context length (EngineClient.modelInfo). */
  readonly statesMaxModelLen: boolean;
  /**
   * How long the engine's health check takes to answer at the least, ms: added to the pool's probe budget
   * (healthTimeoutMs), which is meant for the network and a busy engine, not for a check that waits by design.
   */
  readonly healthAnswerDelayMs: number;
}

/** One kind of engine: how to build its client and what it can do. */
export interface BackendKindEntry {
  readonly description: string;
  readonly capabilities: BackendCapabilities;
  /**
   * Why `url` cannot name an engine of this kind (its scheme: http(s) for engines reached over HTTP, the embedded
   * engine's `file:`/`embedded:` forms), or undefined when it can. Config validation asks it, so a wrong URL is a
   * mistake named by its field, never an exception from the client's constructor.
   */
  urlProblem(url: string): string | undefined;
  /** Builds the client; throws invalid_argument (field kind) for a kind not implemented yet. */
  create(url: string, model: string, options: EngineClientOptions): EngineClient;
}

/** The kinds of engine, named once; {@link KINDS} must hold an entry for each (checked at compile time). */
export const BACKEND_KIND_NAMES = ['vllm', 'sglang', 'embedded'] as const;

/** A kind of engine. */
export type BackendKind = (typeof BACKEND_KIND_NAMES)[number];

/**
 * THE table of engine kinds. Config validation, the client factory, AddBackend's and ListBackends' mapping to the
 * contract's BackendKind enum (BACKEND_KIND_<NAME>, checked at compile time) all read it, so adding a kind is its name and
 * one entry here, plus its enum value in proto/.
 *
 * @example
 * // tgi: { description: 'Text Generation Inference', capabilities: { ... }, create: (url, model, o) => new TgiClient({ url, model, ...o }) },
 */
const KINDS: Readonly<Record<BackendKind, BackendKindEntry>> = {
  vllm: {
    description: 'vLLM OpenAI-compatible server (/v1/completions with token ids; dev-mode /pause, /resume, /abort_requests)',
    capabilities: { pauseModes: ['abort', 'wait', 'keep'], abortByRequestId: true, statesMaxModelLen: true, healthAnswerDelayMs: 0 },
    urlProblem: (url) => httpUrlProblem('vllm', url),
    create: (url, model, o) => new VllmClient({ url, model, ...httpOptions(o), ...(o.checkAnswerId === true && { checkAnswerId: true }) }),
  },
  sglang: {
    description: 'SGLang native server (/generate with input_ids; /pause_generation, /continue_generation, /abort_request)',
    // SGLang's /health_generate sleeps a second before it looks for the engine's answer (http_server.py's loop).
    capabilities: { pauseModes: ['abort', 'keep'], abortByRequestId: true, statesMaxModelLen: true, healthAnswerDelayMs: 1_000 },
    urlProblem: (url) => httpUrlProblem('sglang', url),
    create: (url, model, o) => new SglangClient({ url, model, ...httpOptions(o) }),
  },
  embedded: {
    description: 'llama.cpp in process on CPU (node-llama-cpp): file:///path/model.gguf or embedded://tiny-qwen3; pause, resume and abort in process',
    capabilities: { pauseModes: ['abort', 'wait', 'keep'], abortByRequestId: true, statesMaxModelLen: true, healthAnswerDelayMs: 0 },
    urlProblem: (url) => {
      try {
        parseEmbeddedUrl(url);
        return undefined;
      } catch (err) {
        const message = err instanceof RolloutError && err.field === 'url' ? err.message.replace(/^url: /, '') : String(err);
        return message.split(url).join(withoutCredentials(url));
      }
    },
    create: (url, _model, o) => new EmbeddedEngineClient({ url, ...(o.maxConcurrency !== undefined && { maxConcurrency: o.maxConcurrency }) }),
  },
};

/** What a client of an engine reached over HTTP takes of the shared options. */
function httpOptions(o: EngineClientOptions): { requestTimeoutMs: number; maxResponseBytes: number; bodyIdleTimeoutMs?: number; responseBudget?: ResponseBudget } {
  return {
    requestTimeoutMs: o.requestTimeoutMs ?? 0,
    maxResponseBytes: o.maxResponseBytes ?? 0,
    ...(o.bodyIdleTimeoutMs !== undefined && { bodyIdleTimeoutMs: o.bodyIdleTimeoutMs }),
    ...(o.responseBudget && { responseBudget: o.responseBudget }),
  };
}

/**
 * Engines reached over HTTP take http: and https: URLs only (undici cannot connect to anything else), and only a base
 * URL every request path can be appended to (see {@link engineUrlProblem}: not one ending in /v1, no fragment).
 */
function httpUrlProblem(kind: BackendKind, url: string): string | undefined {
  let protocol: string;
  try {
    protocol = new URL(url).protocol;
  } catch {
    return 'not a URL';
  }
  if (protocol !== 'http:' && protocol !== 'https:') return `a ${kind} engine is reached over http: or https:, not ${protocol}`;
  return engineUrlProblem(url);
}

/** The table entry of a kind. */
export function backendKind(kind: BackendKind): BackendKindEntry {
  return KINDS[kind];
}

/** Builds the client for an engine kind, so AddBackend and the config loader need not know the implementations. */
export function createEngineClient(kind: BackendKind, url: string, model: string, options: EngineClientOptions = {}): EngineClient {
  return KINDS[kind].create(url, model, options);
}
