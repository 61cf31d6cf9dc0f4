import { tokensFrom } from './connection.js';
import { startRolloutServer, type RolloutServer, type RolloutServerOptions } from '../app.js';
import { CheckPool } from '../environments/math/check-pool.js';
import { defaultRegistry } from '../environments/registry.js';
import { checkConfigShape, parseConfig, type ServerConfigInput } from '../config.js';
import { RolloutError } from '../errors.js';
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
 * `rollout serve`: runs until SIGTERM/SIGINT/SIGHUP or an AdminService.Drain call, then drains (admission stops, work in
 * flight gets the grace period, then is cancelled; streams end UNAVAILABLE; sandboxes released) and exits 0.
 * A second signal during the drain cancels the work in flight at once; a third, or a process still there
 * HARD_EXIT_AFTER_MS after the second, exits at once with code 1, logging what was still pending. `inject` replaces
 * the registry or the sandbox driver: the seam bench/soak uses to run this very command with its test doubles
 * (never set by the CLI).
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
  // Else the gRPC bind fails "the port is in use" — by our own metrics endpoint, bound first: named here instead.
  if (parsed.metrics.port !== null && parsed.metrics.port !== 0 && parsed.metrics.port === parsed.port && sameInterface(parsed.metrics.host, parsed.host)) {
    throw new RolloutError('invalid_argument', `metrics.port ${parsed.metrics.port} is the gRPC port (port): give the metrics endpoint a port of its own`);
  }
  // A model folder that is not there is a mistake in the command, named before the fake engine loads from it.
  if (parsed.model.dir !== undefined) await checkModelDir(parsed.model.dir);
  let engine: FakeVllmEngine | undefined;
  let server: RolloutServer;
  let checkPool: CheckPool | undefined;
  try {
    if (opts.fakeEngine) {
      // The fake engine decodes and encodes with the served model's tokenizer, as a real engine would.
      const { tokenizer } = await loadModelBundle(parsed.model.dir === undefined ? {} : { dir: parsed.model.dir });
      engine = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: opts.fakeLatencyMs });
      config.backends = [...backends, { url: engine.url }];
      if (!opts.model) config.model = withModel(config.model, { name: engine.model });
      logger.warn({ url: engine.url }, 'routing to the fake vLLM engine (a test double)');
    }
    // With --math-checker the registry is ours and not the server's, so are the built-in checker's threads: closed below
    // once the server stops. Without a pool of its own the math environment used the shared one, which nobody closes,
    // and its thread kept the process alive after "rollout server stopped" until a second signal.
    if (inject.registry === undefined && opts.mathChecker !== undefined) checkPool = new CheckPool({ logger });
    const registry = inject.registry ?? (opts.mathChecker === undefined ? undefined : defaultRegistry({ math: { checker: opts.mathChecker, ...(checkPool && { checkPool }) }, ...(checkPool && { stem: { checkPool } }) }));
    server = await startRolloutServer(config, { logger, ...(registry && { registry }), ...(inject.sandboxes && { sandboxes: inject.sandboxes }) });
  } catch (err) {
    // Nothing started may outlive a failed start: the process must exit.
    await engine?.close();
    await checkPool?.close();
    throw err;
  }
  // Nobody reading our stdout any more (`serve | head -1`, a log shipper that died) is no reason to stop serving: like
  // pino for the logs, a broken pipe only ends what we write there (else the EPIPE is thrown, a stack trace, exit 1).
  // The same for a terminal that hung up (its window closed, the ssh session dropped): writes to it fail EIO.
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code !== 'EPIPE' && err.code !== 'EIO') throw err;
  });
  // A plain line scripts and tests can wait for, beside the JSON logs.
  console.log(`rollout server listening on ${server.address}`);
  if (server.metrics) console.log(`metrics on http://${server.metrics.address}/metrics`);
  let signals = 0;
  let closingEngine = false;
  // A drain that hangs (a sandbox stop that never returns, an engine that never answers its abort, a stuck journal
  // close) must not keep the process for good: Slurm and Kubernetes send a second and a third signal, or SIGKILL,
  // which tells nobody what was stuck. So: the first signal drains, the second cancels the work in flight, and a
  // third — or HARD_EXIT_AFTER_MS after the second — exits at once, exit 1, naming what was still pending. What
  // dies with the process needs nothing from us (the fake engine, token threads; bubblewrap sandboxes are killed by
  // the kernel with their parent: bwrap --die-with-parent; Apptainer instances, not our children, are stopped by the
  // driver's watchdog when we die); the journal is crash-safe and the next start reaps the rest (empty cgroups, image
  // mounts, an Apptainer instance whose start was in flight).
  const hardExit = (why: string): void => {
    logger.fatal({ state: server.lifecycle.state, inFlight: server.runtime.pipeline.inFlight, pending: pendingOf(server, closingEngine) }, `exiting without finishing the drain: ${why}`);
    process.exit(1);
  };
  const onSignal = (name: NodeJS.Signals): void => {
    // A hang-up only ever starts the drain: it comes more than once (an interactive shell passes its SIGHUP on to its
    // jobs, then the kernel sends the foreground job another as the shell exits), and is nobody insisting.
    if (name === 'SIGHUP' && signals > 0) return logger.info({ signal: name }, 'hang-up while draining: ignored (SIGTERM or SIGINT cancels the work in flight)');
    signals++;
    if (signals >= 3) return hardExit(`third signal (${name})`);
    logger.info({ signal: name }, signals === 1 ? 'draining on signal' : 'second signal: cancelling the work in flight now (a third exits at once)');
    if (signals === 2) {
      // Unref'd: a drain that ends in time exits as usual; one that does not, or a handle left open after it, is cut.
      setTimeout(() => hardExit(`the process did not end within ${HARD_EXIT_AFTER_MS} ms of the second signal`), HARD_EXIT_AFTER_MS).unref();
    }
    void server.drain(signals === 1 ? {} : { graceMs: 0 }).catch(() => undefined);
  };
  // SIGHUP drains like SIGTERM: it is what the server gets when the terminal it was started from goes away (the
  // window closed, the ssh session dropped, no nohup), and dying of it lost the trajectories in flight. No
  // nginx-style "HUP = reload": nothing of a running server is reloadable (flags and config file are read once, at
  // start), and a HUP ignored would keep a server running that its operator believes gone.
  for (const name of SERVE_SIGNALS) process.on(name, onSignal);
  // Stopped by a signal or by AdminService.Drain; either way the drain ran to its end (or failed, which is logged).
  await server.lifecycle.until('stopped');
  closingEngine = true;
  await engine?.close();
  await checkPool?.close();
  for (const name of SERVE_SIGNALS) process.off(name, onSignal);
  if (server.lifecycle.state === 'failed') process.exitCode = 1;
}

/**
 * The signals that drain the server (the first), cancel the work in flight (the second), exit at once (the third);
 * SIGHUP only as the first.
 */
const SERVE_SIGNALS: readonly NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];

/**
 * After the second signal, how long the drain (and the process's end) may still take before the process exits. A
 * drain with no grace normally ends within ~10 s (sandbox stops bounded at 5 s, open calls cut after 5 s): 30 s
 * leaves a loaded host its margin, and is Slurm's KillWait and Kubernetes' default grace.
 */
const HARD_EXIT_AFTER_MS = 30_000;

/** What a drain that has not ended is waiting for, from how far it got (see drainServer's steps). */
function pendingOf(server: RolloutServer, closingEngine: boolean): string {
  switch (server.lifecycle.state) {
    case 'starting':
    case 'running':
    case 'draining': {
      // A cancelled sample leaves `inFlight` when its finish starts: what is left is its release.
      const inFlight = server.runtime.pipeline.inFlight;
      if (inFlight > 0) return `${inFlight} sample(s) still in flight`;
      return 'the release of the cancelled samples (a sandbox stop, an engine call or a delivery that does not return)';
    }
    case 'drained':
      return 'closing open calls, then releasing the metrics endpoint, journal, token threads, engine clients and sandbox driver';
    case 'stopped':
    case 'failed':
      return closingEngine ? 'closing the fake engine, or a handle left open after the server stopped' : 'the end of the drain';
  }
}

/** Whether two bind addresses can clash on one port: the same address, or either is every interface's. */
function sameInterface(a: string, b: string): boolean {
  const any = (host: string): boolean => host === '' || host === '0.0.0.0' || host === '::' || host === '[::]';
  return a === b || any(a) || any(b);
}

/** The `model` section with some fields set: a file's string form is the name, its object form is kept. */
function withModel(model: ServerConfigInput['model'], fields: { name?: string; dir?: string }): ServerConfigInput['model'] {
  const base = typeof model === 'string' ? { name: model } : (model ?? {});
  return { ...base, ...fields };
}
