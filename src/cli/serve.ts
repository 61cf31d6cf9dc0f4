import { tokensFrom } from './connection.js';
import { startRolloutServer, type RolloutServer, type RolloutServerOptions } from '../app.js';
import { defaultRegistry } from '../environments/registry.js';
import { checkConfigShape, parseConfig, type ServerConfigInput } from '../config.js';
import { createLogger } from '../observability/logger.js';
import { FakeVllmEngine } from '../testing/fake-vllm.js';
import { loadModelBundle } from '../tokens/model-bundle.js';
import { checkModelDir } from '../tokens/model-files.js';

export interface ServeOptions {
  file: Record<string, unknown>;
  host?: string;
  port?: number;
  backend: string[];
  model?: string;
  modelDir?: string;
  initConcurrency?: number;
  runConcurrency?: number;
  evalConcurrency?: number;
  initTimeoutMs?: number;
  runTimeoutMs?: number;
  evalTimeoutMs?: number;
  maxAdmitted?: number;
  adminToken?: string;
  adminTokenFile?: string;
  tokenFile?: string;
  tlsCert?: string;
  tlsKey?: string;
  tlsClientCa?: string;
  tlsRequireClientCert?: boolean;
  drainGraceMs?: number;
  sandboxDriver?: 'bwrap' | 'apptainer';
  apptainerPath?: string;
  fakeEngine?: boolean;
  /** The durable journal's directory (config `journal.dir`). */
  journalDir?: string;
  /** Prometheus metrics (config `metrics.port`, `metrics.host`). */
  metricsPort?: number;
  metricsHost?: string;
  fakeLatencyMs: number;
  /** The math environment's default checker (`builtin` unless set; `math-verify` needs scripts/setup.sh's venv). */
  mathChecker?: 'builtin' | 'math-verify';
}

/**
 * `rollout serve`: runs until SIGTERM/SIGINT or an AdminService.Drain call, then drains (admission stops, work in
 * flight gets the grace period, then is cancelled; streams end UNAVAILABLE; sandboxes released) and exits 0.
 * A second signal during the drain cancels the work in flight at once. `inject` replaces the registry or the
 * sandbox driver: the seam bench/soak uses to run this very command with its test doubles (never set by the CLI).
 */
export async function runServe(opts: ServeOptions, inject: Pick<RolloutServerOptions, 'registry' | 'sandboxes'> = {}): Promise<void> {
  const logger = createLogger();
  // The file's shape first (a list where a list belongs, objects where flags are merged in), naming the field.
  checkConfigShape(opts.file);
  // Flags override the config file; the file overrides the built-in defaults.
  const config: ServerConfigInput = {
    ...(opts.file as ServerConfigInput),
    ...(opts.host !== undefined && { host: opts.host }),
    ...(opts.port !== undefined && { port: opts.port }),
  };
  const backends = [...(config.backends ?? []), ...opts.backend.map((url) => ({ url }))];
  if (opts.modelDir) config.model = withModel(config.model, { dir: opts.modelDir });
  if (opts.model) config.model = withModel(config.model, { name: opts.model });
  // Flags override single fields; what neither sets keeps its stage's default (applied by parseConfig).
  const stage = (key: 'init' | 'run' | 'eval', concurrency: number | undefined, timeoutMs: number | undefined): void => {
    if (concurrency === undefined && timeoutMs === undefined) return;
    config[key] = {
      ...config[key],
      ...(concurrency !== undefined && { concurrency }),
      ...(timeoutMs !== undefined && { timeoutMs }),
    };
  };
  stage('init', opts.initConcurrency, opts.initTimeoutMs);
  stage('run', opts.runConcurrency, opts.runTimeoutMs);
  stage('eval', opts.evalConcurrency, opts.evalTimeoutMs);
  if (opts.maxAdmitted !== undefined) config.maxAdmitted = opts.maxAdmitted;
  if (opts.journalDir !== undefined) config.journal = { ...config.journal, dir: opts.journalDir };
  if (opts.metricsPort !== undefined || opts.metricsHost !== undefined) {
    config.metrics = {
      ...config.metrics,
      ...(opts.metricsPort !== undefined && { port: opts.metricsPort }),
      ...(opts.metricsHost !== undefined && { host: opts.metricsHost }),
    };
  }
  if (opts.sandboxDriver !== undefined || opts.apptainerPath !== undefined) {
    config.sandbox = {
      ...config.sandbox,
      ...(opts.sandboxDriver !== undefined && { driver: opts.sandboxDriver }),
      ...(opts.apptainerPath !== undefined && { apptainerPath: opts.apptainerPath }),
    };
  }
  // Tokens from files or the environment, so they never show in process listings; a file wins over the environment.
  const tokens = tokensFrom(opts);
  if (tokens.token || tokens.adminToken) config.auth = { ...config.auth, ...tokens };
  if (opts.tlsCert !== undefined || opts.tlsKey !== undefined || opts.tlsClientCa !== undefined || opts.tlsRequireClientCert) {
    const tls = config.tls ?? { certFile: '', keyFile: '' };
    config.tls = {
      ...tls,
      ...(opts.tlsCert !== undefined && { certFile: opts.tlsCert }),
      ...(opts.tlsKey !== undefined && { keyFile: opts.tlsKey }),
      ...(opts.tlsClientCa !== undefined && { clientCaFile: opts.tlsClientCa }),
      ...(opts.tlsRequireClientCert && { requireClientCert: true }),
    };
  }
  if (opts.drainGraceMs !== undefined) config.drainGraceMs = opts.drainGraceMs;
  config.backends = backends;
  // Validated before anything starts — the fake engine too —, so a typo fails with its path, not a stack trace
  // (and not after an engine was started that nothing would close).
  const parsed = parseConfig(config);
  // A model folder that is not there is a mistake in the command, named before the fake engine loads from it.
  if (parsed.model.dir !== undefined) await checkModelDir(parsed.model.dir);
  let engine: FakeVllmEngine | undefined;
  let server: RolloutServer;
  try {
    if (opts.fakeEngine) {
      // The fake engine decodes and encodes with the served model's tokenizer, as a real engine would.
      const { tokenizer } = await loadModelBundle(parsed.model.dir === undefined ? {} : { dir: parsed.model.dir });
      engine = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: opts.fakeLatencyMs });
      config.backends = [...backends, { url: engine.url }];
      if (!opts.model) config.model = withModel(config.model, { name: engine.model });
      logger.warn({ url: engine.url }, 'routing to the fake vLLM engine (a test double)');
    }
    const registry = inject.registry ?? (opts.mathChecker === undefined ? undefined : defaultRegistry({ math: { checker: opts.mathChecker } }));
    server = await startRolloutServer(config, { logger, ...(registry && { registry }), ...(inject.sandboxes && { sandboxes: inject.sandboxes }) });
  } catch (err) {
    // Nothing started may outlive a failed start: the process must exit.
    await engine?.close();
    throw err;
  }
  // A plain line scripts and tests can wait for, beside the JSON logs.
  console.log(`rollout server listening on ${server.address}`);
  if (server.metrics) console.log(`metrics on http://${server.metrics.address}/metrics`);
  let signals = 0;
  const onSignal = (name: NodeJS.Signals): void => {
    signals++;
    logger.info({ signal: name }, signals === 1 ? 'draining on signal' : 'second signal: cancelling the work in flight now');
    void server.drain(signals === 1 ? {} : { graceMs: 0 }).catch(() => undefined);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  // Stopped by a signal or by AdminService.Drain; either way the drain ran to its end (or failed, which is logged).
  await server.lifecycle.until('stopped');
  process.off('SIGINT', onSignal);
  process.off('SIGTERM', onSignal);
  await engine?.close();
  if (server.lifecycle.state === 'failed') process.exitCode = 1;
}

/** The `model` section with some fields set: a file's string form is the name, its object form is kept. */
function withModel(model: ServerConfigInput['model'], fields: { name?: string; dir?: string }): ServerConfigInput['model'] {
  const base = typeof model === 'string' ? { name: model } : (model ?? {});
  return { ...base, ...fields };
}
