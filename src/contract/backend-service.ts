import type { Metadata, ServerUnaryCall } from '@grpc/grpc-js';
import { bearerMatches } from './auth.js';
import { RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import type { BackendPool, BackendInfo } from '../backends/pool.js';
import { BACKEND_KIND_NAMES, backendKind, createEngineClient, type BackendKind as EngineKind } from '../backends/kinds.js';
import { embeddedBackendProblem, type VocabularyOf } from '../backends/embedded/embedded-vocabulary.js';
import type { CapacitySource as EngineCapacitySource } from '../backends/backend-state.js';
import { withoutCredentials } from '../backends/engine-http.js';
import { backendIdProblem, MAX_BACKEND_MODEL_BYTES, MAX_BACKEND_URL_BYTES } from '../config.js';
import type { EngineClient, LogprobsMode as EngineLogprobsMode } from '../backends/types.js';
import type { PauseMode as EnginePauseMode } from '../backends/types.js';
import { type Backend, BackendKind, type BackendServiceServer, CapacitySource, LogprobsMode, PauseMode } from '../../gen/ts/rollout/v1/backend.js';
import { logprobsModeToProto } from '../pipeline/trajectory.js';
import { unary } from './unary.js';

export interface BackendServiceDeps {
  pool: BackendPool;
  logger: Logger;
  /**
   * When set, every call must carry `authorization: Bearer <token>`. The gRPC server checks the admin token in its
   * auth interceptor (src/contract/auth.ts) and leaves this unset; it is for this service mounted on its own.
   */
  adminToken?: string;
  defaultModel: string;
  requestTimeoutMs: number;
  /** How long an answer's body may stall after its headers (config backendBodyIdleTimeoutMs); absent: the default. */
  bodyIdleTimeoutMs?: number;
  /** Cap on engine answers in bytes (0 or absent = derived per request). */
  maxResponseBytes?: number;
  /** The server-lifetime signal: a call still waiting (a pause waiting for requests in flight) ends when the server stops. */
  lifetime?: AbortSignal;
  /** The server's tokenizer: an embedded engine added here must have its vocabulary, as one configured at start must. */
  vocabulary: VocabularyOf;
}

/** The contract's enum value of a kind: BACKEND_KIND_<NAME> (a kind without one fails to compile). */
function kindToProto(kind: EngineKind): BackendKind {
  return BackendKind[`BACKEND_KIND_${kind.toUpperCase() as Uppercase<EngineKind>}`];
}

/** The kind of an AddBackend request (UNSPECIFIED = vllm), or undefined for a value no kind maps to. */
function kindFromProto(value: BackendKind): EngineKind | undefined {
  if (value === BackendKind.BACKEND_KIND_UNSPECIFIED) return 'vllm';
  return BACKEND_KIND_NAMES.find((kind) => kindToProto(kind) === value);
}

/** A declared mode of an AddBackend request: undefined for UNSPECIFIED; MIXED or an unknown value is invalid_argument. */
function logprobsModeFromProto(value: LogprobsMode): EngineLogprobsMode | undefined {
  if (value === LogprobsMode.LOGPROBS_MODE_UNSPECIFIED) return undefined;
  if (value === LogprobsMode.LOGPROBS_MODE_RAW) return 'raw';
  if (value === LogprobsMode.LOGPROBS_MODE_PROCESSED) return 'processed';
  throw RolloutError.invalid('logprobs_mode', value === LogprobsMode.LOGPROBS_MODE_MIXED ? 'an engine is RAW or PROCESSED; MIXED describes trajectories' : `unknown mode ${value}`);
}

const CAPACITY_SOURCE: Readonly<Record<EngineCapacitySource, CapacitySource>> = {
  configured: CapacitySource.CAPACITY_SOURCE_CONFIGURED,
  engine: CapacitySource.CAPACITY_SOURCE_ENGINE,
  default: CapacitySource.CAPACITY_SOURCE_DEFAULT,
};

/** The pool's pause mode of a PauseGeneration request; UNSPECIFIED and unknown values are refused (field mode). */
function pauseModeFromProto(value: PauseMode): EnginePauseMode {
  switch (value) {
    case PauseMode.PAUSE_MODE_WAIT:
      return 'wait';
    case PauseMode.PAUSE_MODE_ABORT:
      return 'abort';
    case PauseMode.PAUSE_MODE_KEEP:
      return 'keep';
    default:
      throw RolloutError.invalid('mode', value === PauseMode.PAUSE_MODE_UNSPECIFIED ? 'required: PAUSE_MODE_WAIT, PAUSE_MODE_ABORT or PAUSE_MODE_KEEP' : `unknown pause mode ${value}`);
  }
}

/**
 * AddBackend answers this long before the call's deadline with what the engine has told so far (what it has not is
 * learned in the background, as for an engine that does not answer within modelInfoTimeoutMs), so that the answer
 * reaches the caller before its deadline does.
 */
const ANSWER_BEFORE_DEADLINE_MS = 250;

/** Milliseconds until the call's deadline; Infinity when it has none. */
function msUntilDeadline(call: ServerUnaryCall<unknown, unknown>): number {
  const deadline = call.getDeadline();
  const at = deadline instanceof Date ? deadline.getTime() : Number(deadline);
  return Number.isFinite(at) ? at - Date.now() : Infinity;
}

/**
 * The backend's snapshot once the pool has learned what its engine says about itself, or at `budgetMs` what is
 * known by then (the learning goes on in the background). Rejects with the signal's reason (cancelled,
 * deadline_exceeded, unavailable) when the call ends first.
 */
function learnWithin(pool: BackendPool, added: BackendInfo, client: EngineClient, signal: AbortSignal, budgetMs: number): Promise<BackendInfo> {
  const current = (): BackendInfo => pool.list().find((b) => b.id === added.id) ?? added;
  return new Promise<BackendInfo>((resolve, reject) => {
    if (signal.aborted) return reject(RolloutError.from(signal.reason, 'cancelled'));
    let timer: NodeJS.Timeout | undefined;
    const settle = (fn: () => void): void => {
      clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
      fn();
    };
    const onAbort = (): void => settle(() => reject(RolloutError.from(signal.reason, 'cancelled')));
    signal.addEventListener('abort', onAbort, { once: true });
    if (Number.isFinite(budgetMs)) timer = setTimeout(() => settle(() => resolve(current())), Math.max(0, budgetMs));
    pool.learn(added.id, client).then(
      (snapshot) => settle(() => resolve(snapshot)),
      () => settle(() => resolve(current())),
    );
  });
}

/** BackendService (admin): add, remove and list the engines the pool routes to; pause and resume them around weight updates. */
export function backendService(deps: BackendServiceDeps): BackendServiceServer {
  const log = deps.logger.child({ component: 'backend-service' });
  const admin = <Req, Res>(fn: (request: Req, signal: AbortSignal, call: ServerUnaryCall<Req, Res>) => Promise<Res> | Res) =>
    unary<Req, Res>(
      log,
      (request, signal, call) => {
        authorize(call.metadata, deps.adminToken);
        return fn(request, signal, call);
      },
      deps.lifetime,
    );

  return {
    addBackend: admin(async (request, signal, call) => {
      if (Buffer.byteLength(request.url) > MAX_BACKEND_URL_BYTES) throw RolloutError.invalid('url', `at most ${MAX_BACKEND_URL_BYTES} bytes`);
      const idProblem = backendIdProblem(request.id);
      if (idProblem !== undefined) throw RolloutError.invalid('id', idProblem);
      if (Buffer.byteLength(request.model) > MAX_BACKEND_MODEL_BYTES) throw RolloutError.invalid('model', `at most ${MAX_BACKEND_MODEL_BYTES} bytes`);
      let url: URL;
      try {
        url = new URL(request.url);
      } catch {
        throw RolloutError.invalid('url', `not a URL: "${withoutCredentials(request.url)}"`);
      }
      if (request.maxConcurrency < 0) throw RolloutError.invalid('max_concurrency', 'must not be negative');
      const kindName = kindFromProto(request.kind);
      if (kindName === undefined) throw RolloutError.invalid('kind', `unknown kind ${request.kind}`);
      // As the config's per-backend checkAnswerId: only a vLLM's answers need (and can have) their id checked.
      if (request.checkAnswerId && kindName !== 'vllm') {
        throw RolloutError.invalid('check_answer_id', `is for vllm backends (${kindName === 'sglang' ? "an sglang engine's answers are always checked" : "an embedded engine's answers come in process"})`);
      }
      // The kind says which URLs name one of its engines (http(s); the embedded engine's file: and embedded:).
      const urlProblem = backendKind(kindName).urlProblem(request.url);
      if (urlProblem !== undefined) throw RolloutError.invalid('url', urlProblem);
      // What `serve` checks of a configured embedded engine at start: its GGUF is there, with the server's vocabulary.
      if (kindName === 'embedded') {
        const problem = await embeddedBackendProblem(request.url, deps.vocabulary);
        if (problem !== undefined) throw RolloutError.invalid('url', `the embedded engine's model ${problem}`);
      }
      const logprobsMode = logprobsModeFromProto(request.logprobsMode);
      // The client is given the URL with its userinfo (sent as basic auth); everything shown — the default id, the
      // url ListBackends lists (client.url), logs and engine errors — is the URL without it.
      const client = createEngineClient(kindName, url.toString().replace(/\/$/, ''), request.model || deps.defaultModel, {
        requestTimeoutMs: deps.requestTimeoutMs,
        ...(deps.bodyIdleTimeoutMs !== undefined && { bodyIdleTimeoutMs: deps.bodyIdleTimeoutMs }),
        maxResponseBytes: deps.maxResponseBytes ?? 0,
        ...(request.checkAnswerId && { checkAnswerId: true }),
        // Its answers share the pool's budget of bytes buffered at once with every other engine's.
        responseBudget: deps.pool.responseBudget,
      });
      let added: BackendInfo;
      try {
        added = deps.pool.add(client, {
          id: request.id || withoutCredentials(url.toString()).replace(/\/$/, ''),
          maxConcurrency: request.maxConcurrency, // 0: what the engine reports, else the pool's default
          model: request.model || deps.defaultModel,
          ...(logprobsMode !== undefined && { logprobsMode }),
        });
      } catch (err) {
        // Refused (ALREADY_EXISTS, a bad max_concurrency): the pool does not own the client, so it is closed here —
        // its connection pool, or the model an engine kind loads from construction, would otherwise stay per call.
        client.close?.();
        throw err;
      }
      // Answer with what the engine says about itself when it can be learned in time — within modelInfoTimeoutMs and
      // before the call's deadline (an engine that cannot answer by then does not fail the call) — and refuse it when
      // it contradicts what the request declared: its logprobs mode, or the model (a vLLM engine whose GET /v1/models
      // does not list the model exactly is INVALID_ARGUMENT naming `model` and what it serves; it would answer every
      // request 404). A call that ends without an answer (cancelled, its deadline passed,
      // the server stopping) takes the backend out again: as for RemoveBackend, a call that did not complete changes
      // nothing, so a retry is not ALREADY_EXISTS.
      let snapshot: BackendInfo;
      try {
        snapshot = await learnWithin(deps.pool, added, client, signal, msUntilDeadline(call) - ANSWER_BEFORE_DEADLINE_MS);
        deps.pool.checkEngineAgrees(added.id, client);
      } catch (err) {
        // By identity: meanwhile the id may have been removed and given to another backend, which stays.
        await deps.pool.remove(added.id, { drain: false, client }).catch(() => undefined);
        throw err;
      }
      log.info({ id: snapshot.id, url: snapshot.url }, 'backend added');
      return { backend: toBackend(snapshot) };
    }),
    removeBackend: admin(async (request, signal) => {
      if (!request.id) throw RolloutError.invalid('id', 'required');
      await deps.pool.remove(request.id, { drain: request.drain, signal });
      log.info({ id: request.id, drain: request.drain }, 'backend removed');
      return {};
    }),
    listBackends: admin(() => ({ backends: deps.pool.list().map(toBackend) })),
    pauseGeneration: admin(async (request, signal) => {
      const mode = pauseModeFromProto(request.mode);
      // The pool logs the pause and the resume.
      const paused = await deps.pool.pause(mode, { signal, ...(request.backendId !== '' && { id: request.backendId }) });
      return { backends: paused.map(toBackend) };
    }),
    resumeGeneration: admin(async (request, signal) => {
      const resumed = await deps.pool.resume({
        signal,
        ...(request.backendId !== '' && { id: request.backendId }),
        ...(request.policyVersion !== undefined && { policyVersion: request.policyVersion }),
      });
      return { backends: resumed.map(toBackend) };
    }),
  };
}

function authorize(metadata: Metadata, token: string | undefined): void {
  if (!token) return;
  if (!bearerMatches(metadata.get('authorization')[0], token)) {
    throw new RolloutError('unauthenticated', 'admin token required: authorization: Bearer <token>');
  }
}

/** The contract's view of a pool backend (ListBackends, Watch stats). */
export function toBackend(b: BackendInfo): Backend {
  return {
    id: b.id,
    url: b.url,
    kind: kindToProto(b.kind),
    maxConcurrency: b.maxConcurrency,
    // Healthy means usable: an engine that answers its probes but is refused (another model, logits), or held until a
    // resume confirms its weights, is not.
    healthy: b.healthy && b.refusal === undefined && !b.weightsUnknown,
    unusableReason: unusableReason(b),
    draining: b.draining,
    paused: b.paused,
    inflightTrajectories: b.inflightTrajectories,
    inflightRequests: b.inflightRequests,
    assignedTotal: b.assignedTotal,
    policyVersion: b.policyVersion,
    model: b.model,
    maxModelLen: b.maxModelLen ?? 0,
    logprobsMode: logprobsModeToProto(b.logprobsMode),
    capacitySource: CAPACITY_SOURCE[b.capacitySource],
    stalled: b.stalled,
    // int64 as the stubs give it (ts-proto forceLong=number): a count never nears 2^53.
    stalls: b.stalls,
    weightsUnknown: b.weightsUnknown,
  };
}

/** Backend.unusable_reason: why the backend takes no trajectories, '' while it is usable. */
function unusableReason(b: BackendInfo): string {
  if (b.refusal !== undefined) return b.refusal;
  if (b.stalled) return 'hung: its requests went unanswered and its work counters (GET /metrics) stood still for backendStallMs, though it may answer its health checks';
  if (!b.healthy) return 'health checks failing';
  if (b.weightsUnknown) return 'held until a ResumeGeneration confirms its weights: back after it was down while serving a policy version other than 0 (it may have restarted with other weights)';
  return '';
}
