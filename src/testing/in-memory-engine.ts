import { RolloutError } from '../errors.js';
import type { BackendKind, EngineClient, EngineServerInfo, GenerateRequest, GenerateResult } from '../backends/types.js';

/** A request parked in an InMemoryEngineClient until the test answers or fails it. */
export interface PendingGeneration {
  readonly request: GenerateRequest;
  /** Answers the request (default: three tokens, finish "stop"). */
  resolve(result?: Partial<GenerateResult>): void;
  reject(err: unknown): void;
}

/** Identity of an InMemoryEngineClient and, optionally, an automatic answer. */
export interface InMemoryEngineOptions {
  url?: string;
  kind?: BackendKind;
  /** Answers every request at once (after `delayMs`) instead of parking it for the test. */
  respond?: (request: GenerateRequest) => GenerateResult;
  delayMs?: number;
  /**
   * What the engine says about how it runs (EngineClient.serverInfo), or a function answering each ask (it may
   * throw, like an engine that cannot be reached). Absent: the client has no serverInfo, like an engine that never says.
   */
  serverInfo?: EngineServerInfo | (() => Promise<EngineServerInfo>);
}

/** The answer used when a test does not care what the engine says. */
export function defaultResult(overrides: Partial<GenerateResult> = {}): GenerateResult {
  return { tokenIds: [1, 2, 3], logprobs: [-0.5, -0.25, -0.125], finishReason: 'stop', text: 'abc', ...overrides };
}

/**
 * TEST DOUBLE: an EngineClient that lives in memory, for routing tests that need exact control over when each
 * request finishes (the pool's concurrency, draining and failover are about timing, which an HTTP fake makes
 * slow and flaky to pin down). Requests are parked in `pending` until the test resolves them, or answered by
 * `respond`. Honours the request's AbortSignal like a real client: an abort rejects with its reason as a
 * RolloutError and removes the request from `pending`. Use FakeVllmEngine to test the wire protocol instead.
 */
export class InMemoryEngineClient implements EngineClient {
  readonly kind: BackendKind;
  readonly url: string;
  /** What `health` answers. */
  healthy = true;
  /** Every request received, in order. */
  readonly calls: GenerateRequest[] = [];
  readonly pending: PendingGeneration[] = [];
  #running = 0;
  #maxRunning = 0;
  /** Present when the options give a server info (see InMemoryEngineOptions.serverInfo). */
  readonly serverInfo?: () => Promise<EngineServerInfo>;

  constructor(private readonly options: InMemoryEngineOptions = {}) {
    this.kind = options.kind ?? 'vllm';
    this.url = options.url ?? 'memory://engine';
    const info = options.serverInfo;
    if (info !== undefined) this.serverInfo = typeof info === 'function' ? info : () => Promise.resolve({ ...info });
  }

  /** Requests being generated now (parked or delayed). */
  get running(): number {
    return this.#running;
  }

  /** The most requests that were ever running at once. */
  get maxRunning(): number {
    return this.#maxRunning;
  }

  generate(request: GenerateRequest): Promise<GenerateResult> {
    this.calls.push(request);
    const { signal } = request;
    if (signal.aborted) return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
    this.#running++;
    this.#maxRunning = Math.max(this.#maxRunning, this.#running);
    return new Promise<GenerateResult>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const settle = (): boolean => {
        const i = this.pending.indexOf(entry);
        if (i >= 0) this.pending.splice(i, 1);
        if (done) return false;
        done = true;
        this.#running--;
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        return true;
      };
      let done = false;
      const onAbort = (): void => {
        if (settle()) reject(RolloutError.from(signal.reason, 'cancelled'));
      };
      const entry: PendingGeneration = {
        request,
        resolve: (result) => settle() && resolve(defaultResult(result)),
        reject: (err) => settle() && reject(err),
      };
      signal.addEventListener('abort', onAbort, { once: true });
      const { respond, delayMs = 0 } = this.options;
      if (respond === undefined) this.pending.push(entry);
      else timer = setTimeout(() => entry.resolve(respond(request)), delayMs);
    });
  }

  health(): Promise<boolean> {
    return Promise.resolve(this.healthy);
  }
}
