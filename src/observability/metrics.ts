import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { Subscription } from 'rxjs';
import { bearerMatches } from '../contract/auth.js';
import { RolloutError } from '../errors.js';
import type { Logger } from './logger.js';
import type { BackendPool } from '../backends/pool.js';
import type { SessionManager } from '../contract/sessions.js';
import type { RolloutRuntime } from '../runtime.js';
import type { TokenPool } from '../tokens/token-pool.js';
import type { TokenTask, TokenTaskResult } from '../tokens/token-tasks.js';
import { statusName } from '../pipeline/outcome.js';

/** What the metrics read: the server's parts, as they are (gauges are read at scrape time, never on the hot path). */
export interface MetricsSources {
  runtime: RolloutRuntime;
  pool: BackendPool;
  sessions: SessionManager;
  tokenPool?: TokenPool<TokenTask, TokenTaskResult> | undefined;
}

/** The label of a trajectory's environment: a name the registry knows, else one label for all others. */
export const UNKNOWN_ENVIRONMENT = '(unknown)';

/** Seconds: from 10 ms (an eval) to 2 h (a long SWE episode). */
const DURATION_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200];
/** Timing fields of a trajectory, as the `phase` label. */
const PHASES = ['queue', 'init', 'run', 'llm', 'tool', 'eval', 'total'] as const;
/** Turns and tokens per trajectory. */
const TURN_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256];
const TOKEN_BUCKETS = [64, 256, 1024, 4096, 16_384, 65_536, 262_144, 1_048_576];

/**
 * The server's Prometheus metrics, in a registry of their own (several servers in one process keep theirs apart):
 * - trajectories by environment and status (a policy outcome, completed or truncated, apart from every infrastructure
 *   status), their rewards, turns, response tokens and stage times;
 * - stage pools, admission, sessions' unacked and held bytes, token threads, and each engine's load, capacity, health,
 *   pause and policy version, read when scraped;
 * - the process (CPU, memory, event-loop delay, GC: prom-client's defaults).
 * Labels are bounded: environments the registry does not know share one label (a hostile task names anything),
 * engines are the pool's (their ids, at most the pool's size; a removed engine's series go at the next scrape).
 */
export class RolloutMetrics {
  readonly registry = new Registry();
  readonly #finished: Subscription;

  constructor(sources: MetricsSources) {
    const { runtime, pool, sessions, tokenPool } = sources;
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry });
    const environment = (name: string): string => (runtime.deps.registry.has(name) ? name : UNKNOWN_ENVIRONMENT);

    const trajectories = new Counter({ name: 'rollout_trajectories_total', help: 'Trajectories delivered, by environment and status', labelNames: ['environment', 'status'], registers });
    const rewards = new Histogram({
      name: 'rollout_reward',
      help: 'Rewards of trajectories that ended as a policy outcome (completed or truncated), by environment',
      labelNames: ['environment'],
      buckets: [-1, -0.5, 0, 0.25, 0.5, 0.75, 1],
      registers,
    });
    const stale = new Counter({ name: 'rollout_stale_trajectories_total', help: 'Trajectories flagged stale (policy versions past max_staleness)', labelNames: ['environment'], registers });
    const turns = new Histogram({ name: 'rollout_trajectory_turns', help: 'Assistant turns per trajectory', labelNames: ['environment'], buckets: TURN_BUCKETS, registers });
    const tokens = new Histogram({
      name: 'rollout_trajectory_response_tokens',
      help: 'Response tokens per trajectory (sampled and environment)',
      labelNames: ['environment'],
      buckets: TOKEN_BUCKETS,
      registers,
    });
    const seconds = new Histogram({
      name: 'rollout_trajectory_seconds',
      help: 'Time per trajectory by phase (queue, init, run, llm, tool, eval, total)',
      labelNames: ['environment', 'phase'],
      buckets: DURATION_BUCKETS,
      registers,
    });
    this.#finished = runtime.pipeline.events$.subscribe((event) => {
      if (event.type !== 'finished') return;
      const t = event.trajectory;
      const env = environment(t.environment);
      const status = statusName(t.status).toLowerCase();
      trajectories.inc({ environment: env, status });
      if (status === 'completed' || status === 'truncated') rewards.observe({ environment: env }, t.reward);
      if (t.stale) stale.inc({ environment: env });
      turns.observe({ environment: env }, t.numTurns);
      tokens.observe({ environment: env }, t.responseTokenIds.length);
      const timing = t.timing;
      if (timing !== undefined) {
        const ms = { queue: timing.queueMs, init: timing.initMs, run: timing.runMs, llm: timing.llmMs, tool: timing.toolMs, eval: timing.evalMs, total: timing.totalMs };
        for (const phase of PHASES) seconds.observe({ environment: env, phase }, ms[phase] / 1000);
      }
    });

    /** A gauge whose values are read when scraped (reset first: a series whose subject went goes too). */
    const gauge = (name: string, help: string, labelNames: string[], read: (set: (labels: Record<string, string>, value: number) => void) => void): void => {
      new Gauge({
        name,
        help,
        labelNames,
        registers,
        collect(this: Gauge) {
          this.reset();
          read((labels, value) => this.set(labels, value));
        },
      });
    };
    for (const [key, help] of [
      ['active', 'Samples a stage is working on'],
      ['queued', 'Samples waiting for a stage worker'],
      ['concurrency', "A stage's workers"],
    ] as const) {
      gauge(`rollout_stage_${key}`, help, ['stage'], (set) => {
        for (const s of runtime.pipeline.stageStats()) set({ stage: s.stage }, s[key]);
      });
    }
    gauge('rollout_samples_in_flight', 'Samples in the pipeline', [], (set) => set({}, runtime.pipeline.inFlight));
    gauge('rollout_samples_admitted', 'Samples admitted (queued or in a stage)', [], (set) => set({}, runtime.admission.inFlight));
    gauge('rollout_samples_admission_capacity', 'The admission bound (maxAdmitted)', [], (set) => set({}, runtime.admission.capacity));
    gauge('rollout_sessions', 'Trainer sessions', [], (set) => set({}, sessions.stats().sessions));
    gauge('rollout_session_bytes', "Sessions' trajectory bytes: unacked, held (delivery paused), outbox", ['kind'], (set) => {
      const s = sessions.stats();
      set({ kind: 'unacked' }, s.unackedBytes);
      set({ kind: 'held' }, s.heldBytes);
      set({ kind: 'outbox' }, s.outboxBytes);
    });
    const backendGauge = (name: string, help: string, value: (b: ReturnType<BackendPool['list']>[number]) => number): void =>
      gauge(name, help, ['backend'], (set) => {
        for (const b of pool.list()) set({ backend: b.id }, value(b));
      });
    backendGauge('rollout_backend_inflight_requests', 'Requests an engine is serving', (b) => b.inflightRequests);
    backendGauge('rollout_backend_inflight_trajectories', 'Trajectories leased to an engine (sticky routing)', (b) => b.inflightTrajectories);
    backendGauge('rollout_backend_max_concurrency', "An engine's capacity (its max concurrent sequences)", (b) => b.maxConcurrency);
    // As ListBackends' and Watch stats' `healthy` (toBackend): an engine held until a resume confirms its weights is not.
    backendGauge('rollout_backend_healthy', '1 when an engine is usable (answers its probes, is not refused, and is not held with its weights unknown)', (b) =>
      b.healthy && b.refusal === undefined && !b.weightsUnknown ? 1 : 0,
    );
    backendGauge('rollout_backend_paused', '1 while an engine is paused (weight sync)', (b) => (b.paused ? 1 : 0));
    backendGauge('rollout_backend_draining', '1 while an engine is drained', (b) => (b.draining ? 1 : 0));
    backendGauge('rollout_backend_policy_version', 'The policy version an engine serves', (b) => b.policyVersion);
    backendGauge('rollout_backend_stalls', 'Times an engine was found hung (requests unanswered, work counters still): its trajectories moved', (b) => b.stalls);
    backendGauge('rollout_backend_weights_unknown', '1 while an engine back after it was down is held (no trajectories) until a ResumeGeneration confirms its weights', (b) => (b.weightsUnknown ? 1 : 0));
    backendGauge('rollout_backend_misdelivered_answers', "An engine's answers refused as meant for another request (each asked again)", (b) => b.misdeliveredAnswers);
    backendGauge('rollout_backend_assigned_trajectories', 'Trajectories ever leased to an engine', (b) => b.assignedTotal);
    if (tokenPool !== undefined) {
      gauge('rollout_token_threads', 'Token threads: workers, busy, queued tasks', ['kind'], (set) => {
        const s = tokenPool.stats();
        set({ kind: 'workers' }, s.workers);
        set({ kind: 'busy' }, s.busy);
        set({ kind: 'queued' }, s.queued);
      });
      gauge('rollout_token_thread_crashes', 'Token threads that died and were replaced', [], (set) => set({}, tokenPool.stats().crashes));
    }
  }

  /** Stops counting (the pipeline's subscription); the registry stays readable. */
  close(): void {
    this.#finished.unsubscribe();
  }
}

export interface MetricsServerOptions {
  host: string;
  port: number;
  /** When set, a scrape needs `authorization: Bearer <token>` (401 otherwise). */
  token?: string | undefined;
  logger: Logger;
}

/** The HTTP endpoint that serves GET /metrics (text exposition format); anything else is 404. */
export interface MetricsServer {
  readonly address: string;
  readonly port: number;
  close(): Promise<void>;
}

/** Connections the metrics endpoint holds at once; one more is closed at once (a scraper needs one). */
export const METRICS_MAX_CONNECTIONS = 64;

/**
 * Serves GET /metrics from `metrics.registry`. Scrapes that arrive while a collection runs share it (one collection at a
 * time, however many clients scrape in a loop), and at most {@link METRICS_MAX_CONNECTIONS} connections are held.
 */
export async function startMetricsServer(metrics: Pick<RolloutMetrics, 'registry'>, options: MetricsServerOptions): Promise<MetricsServer> {
  const log = options.logger.child({ component: 'metrics' });
  let collecting: Promise<string> | undefined;
  const collect = (): Promise<string> =>
    (collecting ??= metrics.registry.metrics().finally(() => {
      collecting = undefined;
    }));
  const handle = (req: IncomingMessage, res: ServerResponse): void => {
    const path = (req.url ?? '/').split('?')[0];
    if (path !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: GET /metrics\n');
      return;
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' }).end('GET /metrics\n');
      return;
    }
    if (options.token !== undefined && !bearerMatches(req.headers.authorization, options.token)) {
      res.writeHead(401, { 'www-authenticate': 'Bearer', 'content-type': 'text/plain' }).end('a bearer token is required: authorization: Bearer <token>\n');
      return;
    }
    collect().then(
      (text) => res.writeHead(200, { 'content-type': metrics.registry.contentType }).end(req.method === 'HEAD' ? undefined : text),
      (err: unknown) => {
        log.error({ err }, 'metrics collection failed');
        res.writeHead(500, { 'content-type': 'text/plain' }).end('metrics collection failed\n');
      },
    );
  };
  const server: Server = createServer(handle);
  // A scraper that connects and sends nothing is not kept: headers within 10 s, the whole request within 30 s.
  server.headersTimeout = 10_000;
  server.requestTimeout = 30_000;
  server.maxHeadersCount = 64;
  server.maxConnections = METRICS_MAX_CONNECTIONS;
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) =>
      reject(new RolloutError('failed_precondition', `metrics.port: cannot listen on ${options.host}:${options.port}: ${err.code ?? err.message}`, { field: 'metrics.port', cause: err })),
    );
    server.listen(options.port, options.host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  const address = `${options.host.includes(':') ? `[${options.host}]` : options.host}:${port}`;
  log.info({ address: `http://${address}/metrics`, token: options.token !== undefined }, 'serving Prometheus metrics');
  return {
    address,
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
