/**
 * Orchestration benchmark: how close the rollout server gets to the engine-bound limit, and what an in-flight
 * trajectory costs it. Prints figures (never asserts timings); exits 1 only when trajectories or requests failed.
 *
 *   npx tsx bench/orchestration.ts [--trajectories 4000] [--concurrency 1000] [--hold 1000] ...
 *
 * Three processes: this one (the TS gRPC client and the direct VllmClient), an engine child (the fake vLLM
 * engine, a test double, at zero token latency; after a service time per request in the engine-bound passes) and a
 * server child (startRolloutServer), so the server's memory and CPU are measured alone. See bench/README.md for what
 * each figure means.
 */
import { Command } from 'commander';
import { positiveInt, positiveIntList } from './options.js';
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, platform, release, totalmem } from 'node:os';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RolloutClient } from '../src/client/rollout-client.js';
import { CALC_ENVIRONMENT } from '../src/testing/calc-environment.js';
import { LONG_CONTEXT_ENVIRONMENT } from '../src/testing/long-context-environment.js';
import { NODE_FLAGS } from '../src/cli/node-flags.js';
import { referenceWorkMs } from './calibration.js';
import { ChildHandle } from './child-rpc.js';
import { driveServer, percentile, replayDirect, type DriveResult, type ReplayResult } from './drive.js';
import type { EngineApi, EngineInfo, EngineStats } from './engine-child.js';
import { holdInFlight, holdUnacked, type HoldResult, type UnackedResult } from './memory.js';
import { note } from './progress.js';
import type { EventLoopStats, ServerApi, ServerChildOptions, ServerInfo, ServerStats, ThreadCpu } from './server-child.js';
import { renderReport } from './report.js';
import { sampleInFlight, type InFlightSamples } from './sampler.js';
import { machineBusyMicros } from './system-load.js';

export interface BenchOptions {
  trajectories: number;
  concurrency: number;
  groupSize: number;
  warmup: number;
  hold: number;
  sandboxTrajectories: number;
  sandboxConcurrency: number;
  sandboxPass: boolean;
  longTrajectories: number;
  longConcurrency: number;
  longWarmup: number;
  longPromptChars: number;
  longPages: number;
  longPageChars: number;
  longPass: boolean;
  /** Mean service times (ms per request) of the engine-bound passes, in order. */
  engineBoundMs: number[];
  /** Server processes sharing the load in the engine-bound passes: each count is run at every mean. */
  engineBoundServers: number[];
  engineBoundPass: boolean;
  output: string;
  phaseTimeout: number;
}

type Engine = ChildHandle<EngineApi, EngineInfo>;
type Server = ChildHandle<ServerApi, ServerInfo>;

function parseOptions(argv: readonly string[]): BenchOptions {
  const program = new Command()
    .name('orchestration')
    .description('Rollout server throughput vs the engine-bound limit, and server memory per in-flight trajectory (fake vLLM engine).')
    .option('--trajectories <n>', 'trajectories in the measured server pass', positiveInt, 4000)
    .option('--concurrency <n>', 'trajectories in flight (server pass) and requests in flight (direct pass)', positiveInt, 1000)
    .option('--group-size <n>', 'samples per task (GRPO group size)', positiveInt, 1)
    .option('--warmup <n>', 'trajectories (and replayed requests) to warm up before measuring: enough for V8 to be done optimizing the server at this load (bench/README round 14)', positiveInt, 8000)
    .option('--hold <n>', 'trajectories held in flight for the memory measurement', positiveInt, 1000)
    .option('--sandbox-trajectories <n>', 'trajectories in the real-sandbox pass', positiveInt, 64)
    .option('--sandbox-concurrency <n>', 'concurrency of the real-sandbox pass', positiveInt, 16)
    .option('--no-sandbox-pass', 'skip the bubblewrap pass')
    .option('--long-trajectories <n>', 'trajectories in the long-context pass (256: its loop-delay p99 is then the 11th-worst of ~1,100 samples, not the 3rd of ~280)', positiveInt, 256)
    .option('--long-concurrency <n>', 'concurrency of the long-context pass', positiveInt, 8)
    .option('--long-warmup <n>', 'long-context trajectories to warm up each long-context server before measuring', positiveInt, 2)
    .option('--long-prompt-chars <n>', 'characters of log in each long-context prompt (~1.56 per Qwen3 token)', positiveInt, 86_000)
    .option('--long-pages <n>', 'environment turns (pages read) per long-context trajectory', positiveInt, 4)
    .option('--long-page-chars <n>', 'characters per page the tool returns', positiveInt, 3_500)
    .option('--no-long-pass', 'skip the long-context pass')
    .option('--engine-bound-ms <list>', 'mean service times (ms per request, comma-separated) of the engine-bound passes', positiveIntList, [1000, 500, 250])
    .option('--engine-bound-servers <list>', 'server processes sharing the load in the engine-bound passes (comma-separated: each is run)', positiveIntList, [1])
    .option('--no-engine-bound-pass', 'skip the engine-bound passes')
    .option('--output <path>', 'JSON results file', fileURLToPath(new URL('./results/orchestration.json', import.meta.url)))
    .option('--phase-timeout <s>', 'give up on a phase after this many seconds', positiveInt, 180)
    .parse([...argv]);
  const o = program.opts<Omit<BenchOptions, 'phaseTimeout'> & { phaseTimeout: number }>();
  return { ...o, phaseTimeout: o.phaseTimeout * 1000 };
}

const cpuMicros = (c: NodeJS.CpuUsage): number => c.user + c.system;

/** CPU time (µs) each process spent between two snapshots, and what the rest of the machine spent meanwhile. */
export interface CpuSpent {
  client: number;
  server: number;
  engine: number;
  /** Other processes on the machine (from /proc/stat); NaN where unknown. */
  others: number;
  wallMicros: number;
  /** The server's CPU by thread (event loop, token threads, V8/libuv helpers); undefined off Linux. */
  serverThreads: ThreadCpu | undefined;
}

interface CpuSnapshot {
  client: number;
  server: number;
  serverThreads: ThreadCpu | undefined;
  engine: number;
  machine: number | undefined;
  at: number;
}

/** CPU so far of this process, the engine child and the given server children (summed, with their threads). */
async function cpuSnapshot(engine: Engine, ...servers: Server[]): Promise<CpuSnapshot> {
  const [e, ...s] = await Promise.all([engine.call('stats'), ...servers.map((server) => server.call('stats'))]);
  const threads = s.map((x) => x.threads);
  const serverThreads = s.length > 0 && threads.every((t) => t !== undefined)
    ? threads.reduce((a, b) => ({ main: a.main + b.main, tokenThreads: a.tokenThreads + b.tokenThreads, helpers: a.helpers + b.helpers }))
    : undefined;
  const server = s.reduce((sum, x) => sum + cpuMicros(x.cpu), 0);
  return { client: cpuMicros(process.cpuUsage()), server, serverThreads, engine: cpuMicros(e.cpu), machine: machineBusyMicros(), at: performance.now() };
}

function spent(a: CpuSnapshot, b: CpuSnapshot): CpuSpent {
  const ours = b.client - a.client + (b.server - a.server) + (b.engine - a.engine);
  const machine = a.machine !== undefined && b.machine !== undefined ? b.machine - a.machine : NaN;
  const t0 = a.serverThreads;
  const t1 = b.serverThreads;
  const serverThreads = t0 && t1 && { main: t1.main - t0.main, tokenThreads: t1.tokenThreads - t0.tokenThreads, helpers: t1.helpers - t0.helpers };
  return { client: b.client - a.client, server: b.server - a.server, serverThreads, engine: b.engine - a.engine, others: Math.max(0, machine - ours), wallMicros: (b.at - a.at) * 1000 };
}

/** Direct passes over the server pass's recorded requests (see the direct pass in main). */
const DIRECT_PASSES = 3;

/** The pass of median wall time, with the errors of every pass (so a failed request anywhere is reported). */
function medianPass(passes: readonly ReplayResult[]): ReplayResult {
  const median = [...passes].sort((a, b) => a.wallMs - b.wallMs)[Math.floor(passes.length / 2)]!;
  return { ...median, errors: passes.reduce((n, p) => n + p.errors, 0), firstError: passes.find((p) => p.firstError !== undefined)?.firstError };
}

/** CPU spent over `passes` equal passes, per pass. */
function perPass(c: CpuSpent, passes: number): CpuSpent {
  const t = c.serverThreads;
  return {
    client: c.client / passes, server: c.server / passes, engine: c.engine / passes, others: c.others / passes, wallMicros: c.wallMicros / passes,
    serverThreads: t && { main: t.main / passes, tokenThreads: t.tokenThreads / passes, helpers: t.helpers / passes },
  };
}

/**
 * The server under test: defaults except what the load needs (run-stage concurrency and the backend's request
 * slots at least the load, admission well above it). `retainFinishedTasks` is set only for the memory server.
 */
function serverConfig(engine: Engine, sandbox: ServerChildOptions['sandbox'], concurrency: number, retainFinishedTasks?: number, tokenWorkers?: number): ServerChildOptions {
  return {
    sandbox,
    config: {
      ...(tokenWorkers !== undefined && { tokenWorkers: { count: tokenWorkers } }),
      model: engine.info.model,
      backends: [{ url: engine.info.url, maxConcurrency: Math.max(concurrency, 256) }],
      run: { concurrency: Math.max(concurrency, 1024), timeoutMs: 600_000 },
      maxAdmitted: Math.max(20_000, concurrency * 2),
      ...(retainFinishedTasks !== undefined && { retainFinishedTasks }),
    },
  };
}

const SERVER_CHILD = new URL('./server-child.ts', import.meta.url);
const ENGINE_CHILD = new URL('./engine-child.ts', import.meta.url);

async function startServer(
  engine: Engine,
  sandbox: ServerChildOptions['sandbox'],
  concurrency: number,
  retainFinishedTasks?: number,
  tokenWorkers?: number,
): Promise<{ server: Server; client: RolloutClient }> {
  const options = serverConfig(engine, sandbox, concurrency, retainFinishedTasks, tokenWorkers);
  // Run as the `rollout` command runs node (src/cli/node-flags.ts), so the figures are the product's.
  const server = await ChildHandle.spawn<ServerApi, ServerInfo>(`server-child(${sandbox})`, SERVER_CHILD, [JSON.stringify(options)], 60_000, NODE_FLAGS);
  children.add(server);
  return { server, client: new RolloutClient(server.info.address) };
}

async function stopServer(s: { server: Server; client: RolloutClient }): Promise<void> {
  s.client.close();
  await s.server.stop('shutdown');
  children.delete(s.server);
}

const children = new Set<{ kill(): void }>();

/** Everything the benchmark measured, as written to the JSON file. */
export interface BenchResults {
  options: BenchOptions;
  machine: Record<string, unknown>;
  server: DriveResult & { cpu: CpuSpent; inFlight: InFlightSamples; eventLoop: EventLoopStats; retained: { tasks: number; trajectories: number; heapBytes: number }; after: ServerStats };
  /** The median of the direct passes (by wall time; errors of all of them), CPU per pass (their mean). */
  direct: ReplayResult & { cpu: CpuSpent; engine: EngineStats; passesWallMs: number[] };
  hold: HoldResult;
  /** Finished trajectories a session keeps until acked (same server as `hold`, which retains no finished task). */
  unacked: UnackedResult;
  nullSmall: DriveResult | undefined;
  bwrap: DriveResult | undefined;
  /** The long-context pass: with the default token threads, then with none (all token work on the event loop). */
  long: { threads: LongPass; inline: LongPass } | undefined;
  /** The engine-bound passes, one per service time. */
  engineBound: EngineBoundPass[];
}

/**
 * One engine-bound pass: the engine double answers every request a service time after it arrives (timers, no CPU;
 * 0.5-1.5 × `serviceMs`, see the engine child's `setServiceMs`), so the engine and not the shared cores is the limit
 * while the server keeps up; the same server load, then its recorded requests replayed straight at the engine at the
 * same concurrency.
 */
export interface EngineBoundPass {
  /** The mean service time, ms. */
  serviceMs: number;
  /** Server processes the load was split over (each its own session, its share of the trajectories and concurrency). */
  servers: number;
  server: DriveResult;
  serverCpu: CpuSpent;
  direct: ReplayResult;
  directCpu: CpuSpent;
}

/** One long-context pass: how the server's event loop fared while ~64K-token conversations took environment turns. */
export interface LongPass {
  tokenWorkers: number;
  drive: DriveResult;
  eventLoop: EventLoopStats;
  cpu: CpuSpent;
  /** Prompt lengths of the engine requests after the first turn (contexts at which environment turns were taken). */
  contextTokens: { mean: number; max: number; requests: number };
}

async function run(o: BenchOptions): Promise<BenchResults> {
  const t = o.phaseTimeout;
  const referenceAtStart = referenceWorkMs();
  const engine = await ChildHandle.spawn<EngineApi, EngineInfo>('engine-child', ENGINE_CHILD, []);
  children.add(engine);
  note(`fake vLLM engine ${engine.info.url} (pid ${engine.pid}); starting server child (null sandboxes, ${CALC_ENVIRONMENT})`);

  // 1. Through the server: warm up, then the measured pass with the engine recording every request.
  const a = await startServer(engine, 'null', o.concurrency);
  const base = { environment: CALC_ENVIRONMENT, groupSize: o.groupSize, timeoutMs: t };
  await driveServer(a.client, { ...base, label: 'server warm-up', prefix: 'warm', trajectories: o.warmup, concurrency: Math.min(o.concurrency, o.warmup), seed: 1 });
  await engine.call('record', true);
  const c0 = await cpuSnapshot(engine, a.server);
  await a.server.call('eventLoop');
  const live = { submitted: 0, received: 0 };
  const sampler = await sampleInFlight(a.server, live);
  const serverPass = await driveServer(a.client, { ...base, label: 'server pass', prefix: 'run', trajectories: o.trajectories, concurrency: o.concurrency, seed: 100_000, live });
  const inFlight = await sampler.stop();
  const eventLoop = await a.server.call('eventLoop');
  const c1 = await cpuSnapshot(engine, a.server);
  await engine.call('record', false);
  const recorded = await engine.call('takeRecorded');
  const serverAfter = await a.server.call('stats');
  const retained = await a.server.call('dropTaskStore');
  let nullSmall: DriveResult | undefined;
  if (o.sandboxPass) {
    nullSmall = await driveServer(a.client, { ...base, label: 'null sandboxes, small load', prefix: 'small', groupSize: 1,
      trajectories: o.sandboxTrajectories, concurrency: o.sandboxConcurrency, seed: 500_000 });
  }
  await stopServer(a);

  // 2. Directly: the same requests, straight to the engine with VllmClient, at the same concurrency.
  await replayDirect(engine.info.url, engine.info.model, recorded.slice(0, Math.min(recorded.length, o.warmup * 2)), o.concurrency, 'direct warm-up');
  // Replayed DIRECT_PASSES times, its rate the median pass's: one pass lasts under a second on a fast machine, and a
  // single slow draw once doubled the ratio (0.63 against 0.31-0.38 for the same code).
  const d0 = await cpuSnapshot(engine);
  const directPasses: ReplayResult[] = [];
  for (let i = 1; i <= DIRECT_PASSES; i++) {
    directPasses.push(await replayDirect(engine.info.url, engine.info.model, recorded, o.concurrency, `direct pass ${i}/${DIRECT_PASSES} (VllmClient)`));
  }
  const d1 = await cpuSnapshot(engine);
  const direct = medianPass(directPasses);
  const engineStats = await engine.call('stats');
  // The machine's speed again, with the children idle: a change since the start shows the speed drifting mid-run.
  const referenceAfterPasses = referenceWorkMs();

  // 3. Memory per in-flight trajectory, on a fresh server that keeps no finished task (so what is left after the
  // held trajectories end is a leak, not the task store).
  const b = await startServer(engine, 'null', o.hold, 0);
  await driveServer(b.client, { ...base, label: 'memory warm-up', prefix: 'mwarm', trajectories: Math.min(o.warmup, 200), concurrency: Math.min(o.warmup, 200), seed: 700_000 });
  const hold = await holdInFlight(b.client, engine, b.server, o.hold, t);
  const unacked = await holdUnacked(b.client, b.server, o.hold, t);
  await stopServer(b);

  // 4. Real sandboxes: the math environment, its python tool in bubblewrap.
  let bwrap: DriveResult | undefined;
  if (o.sandboxPass) {
    await engine.call('setMode', 'math');
    const s = await startServer(engine, 'bwrap', o.sandboxConcurrency);
    const bw = { environment: 'math', groupSize: 1, timeoutMs: t, concurrency: o.sandboxConcurrency };
    await driveServer(s.client, { ...bw, label: 'bwrap warm-up', prefix: 'bwarm', trajectories: Math.min(8, o.sandboxTrajectories), seed: 800_000 });
    bwrap = await driveServer(s.client, { ...bw, label: 'bwrap sandboxes (math + python)', prefix: 'bw', trajectories: o.sandboxTrajectories, seed: 810_000 });
    await stopServer(s);
    await engine.call('setMode', 'calc');
  }
  // 5. Long contexts: event-loop delay while ~64K-token conversations take environment turns, with token threads
  // (the default) and with none, in one run.
  let long: BenchResults['long'];
  if (o.longPass) {
    await engine.call('setMode', 'long');
    long = { threads: await longPass(engine, o, undefined), inline: await longPass(engine, o, 0) };
    await engine.call('setMode', 'calc');
  }
  const engineBound = o.engineBoundPass ? await engineBoundPasses(engine, o) : [];
  await engine.stop('shutdown');
  children.delete(engine);

  return {
    options: o,
    machine: {
      cpus: cpus().length,
      cpuModel: cpus()[0]?.model ?? 'unknown',
      totalMemoryBytes: totalmem(),
      node: process.version,
      platform: `${platform()} ${release()}`,
      loadavg: loadavg(),
      date: new Date().toISOString(),
      referenceWorkMs: { atStart: referenceAtStart, afterPasses: referenceAfterPasses },
    },
    server: { ...serverPass, cpu: spent(c0, c1), inFlight, eventLoop, retained, after: serverAfter },
    direct: { ...direct, cpu: perPass(spent(d0, d1), DIRECT_PASSES), engine: engineStats, passesWallMs: directPasses.map((p) => p.wallMs) },
    hold,
    unacked,
    nullSmall,
    bwrap,
    long,
    engineBound,
  };
}

/**
 * The engine-bound passes: for each server count and mean service time, the server load (its requests recorded),
 * then those requests straight at the engine, both at `--concurrency`. With n servers the load is split over n
 * server children, each its own session with its share of the trajectories and the concurrency, driven at once (as a
 * client given n addresses spreads tasks). The servers of a count are warmed up once and serve all its means.
 */
async function engineBoundPasses(engine: Engine, o: BenchOptions): Promise<EngineBoundPass[]> {
  const base = { environment: CALC_ENVIRONMENT, groupSize: o.groupSize, timeoutMs: o.phaseTimeout };
  const passes: EngineBoundPass[] = [];
  for (const n of o.engineBoundServers) {
    const share = (total: number, k: number): number => Math.floor(total / n) + (k < total % n ? 1 : 0);
    const servers: { server: Server; client: RolloutClient }[] = [];
    try {
      for (let k = 0; k < n; k++) servers.push(await startServer(engine, 'null', share(o.concurrency, k)));
      await Promise.all(servers.map((s, k) => driveServer(s.client, { ...base, label: `engine-bound warm-up (server ${k + 1}/${n})`, prefix: 'ewarm',
        trajectories: share(o.warmup, k), concurrency: Math.min(share(o.concurrency, k), share(o.warmup, k)), seed: 1_000_000 + k * o.warmup })));
      for (const [i, serviceMs] of o.engineBoundMs.entries()) {
        const label = `engine-bound ${serviceMs} ms${n > 1 ? `, ${n} servers` : ''}`;
        await engine.call('setServiceMs', serviceMs);
        await engine.call('record', true);
        const c0 = await cpuSnapshot(engine, ...servers.map((s) => s.server));
        const started = performance.now();
        const drives = await Promise.all(servers.map((s, k) => driveServer(s.client, { ...base, label: `${label}: server${n > 1 ? ` ${k + 1}` : ''}`, prefix: `eb${i}`,
          trajectories: share(o.trajectories, k), concurrency: share(o.concurrency, k), seed: 1_100_000 + i * o.trajectories + k * share(o.trajectories, 0) })));
        const wallMs = performance.now() - started;
        const c1 = await cpuSnapshot(engine, ...servers.map((s) => s.server));
        await engine.call('record', false);
        const recorded = await engine.call('takeRecorded');
        const d0 = await cpuSnapshot(engine);
        const direct = await replayDirect(engine.info.url, engine.info.model, recorded, o.concurrency, `${label}: direct`);
        const d1 = await cpuSnapshot(engine);
        passes.push({ serviceMs, servers: n, server: mergeDrives(drives, wallMs), serverCpu: spent(c0, c1), direct, directCpu: spent(d0, d1) });
      }
    } finally {
      await engine.call('setServiceMs', 0);
      for (const s of servers) await stopServer(s);
    }
  }
  return passes;
}

/** Loads driven at once through several servers, as one: everything summed or joined, over the common wall time. */
function mergeDrives(drives: readonly DriveResult[], wallMs: number): DriveResult {
  if (drives.length === 1 && drives[0]) return drives[0];
  const out: DriveResult = { trajectories: 0, wallMs, turns: 0, latenciesMs: [], acceptMs: [], serverTotalMs: [], statuses: {}, meanReward: 0, rejected: [], errors: [] };
  let rewardSum = 0;
  for (const d of drives) {
    out.trajectories += d.trajectories;
    out.turns += d.turns;
    out.latenciesMs.push(...d.latenciesMs);
    out.acceptMs.push(...d.acceptMs);
    out.serverTotalMs.push(...d.serverTotalMs);
    for (const [k, v] of Object.entries(d.statuses)) out.statuses[k] = (out.statuses[k] ?? 0) + v;
    out.rejected.push(...d.rejected);
    out.errors.push(...d.errors);
    rewardSum += d.meanReward * d.trajectories;
  }
  out.meanReward = out.trajectories > 0 ? rewardSum / out.trajectories : 0;
  return out;
}

async function longPass(engine: Engine, o: BenchOptions, tokenWorkers: number | undefined): Promise<LongPass> {
  const s = await startServer(engine, 'null', o.longConcurrency, undefined, tokenWorkers);
  const { tokenWorkers: used } = await s.server.call('tokenWork');
  const label = used === 0 ? 'no token threads' : `${used} token thread${used === 1 ? '' : 's'}`;
  const task = (taskId: string, environment: string, numSamples: number, seed: number) => ({
    taskId,
    environment,
    numSamples,
    instance: { seed, promptChars: o.longPromptChars, pages: o.longPages, pageChars: o.longPageChars },
    sampling: { temperature: 1, seed, maxTokensPerTurn: 64, maxTotalTokens: 131_000, stop: [] },
  });
  const base = { environment: LONG_CONTEXT_ENVIRONMENT, groupSize: 1, timeoutMs: o.phaseTimeout, task };
  // The double's texts (an 86K-character log per task, ~2-3 ms of the server's event loop to generate) are made before
  // each drive, as a dataset's would already be in memory: the loop delay measured is the server's, not the double's.
  const prepare = (seed: number, trajectories: number) =>
    s.server.call('prepareLongContext', Array.from({ length: trajectories }, (_, i) => task('', '', 1, seed + i).instance));
  await prepare(900_000, o.longWarmup);
  await driveServer(s.client, { ...base, label: `long contexts warm-up (${label})`, prefix: 'lwarm', trajectories: o.longWarmup, concurrency: Math.min(o.longConcurrency, o.longWarmup), seed: 900_000 });
  await prepare(910_000, o.longTrajectories);
  await engine.call('record', true);
  await s.server.call('eventLoop');
  const c0 = await cpuSnapshot(engine, s.server);
  const drive = await driveServer(s.client, { ...base, label: `long contexts (${label})`, prefix: 'long', trajectories: o.longTrajectories, concurrency: o.longConcurrency, seed: 910_000 });
  const eventLoop = await s.server.call('eventLoop');
  const c1 = await cpuSnapshot(engine, s.server);
  await engine.call('record', false);
  const later = (await engine.call('takeRecorded')).filter((r) => r.laterTurn).map((r) => r.prompt.length);
  await stopServer(s);
  const sum = later.reduce((a, b) => a + b, 0);
  return { tokenWorkers: used, drive, eventLoop, cpu: spent(c0, c1), contextTokens: { mean: later.length ? sum / later.length : 0, max: Math.max(0, ...later), requests: later.length } };
}

async function main(): Promise<number> {
  const options = parseOptions(process.argv);
  const kill = (): void => children.forEach((c) => c.kill());
  process.once('SIGINT', () => {
    kill();
    process.exit(130);
  });
  let results: BenchResults;
  try {
    results = await run(options);
  } catch (err) {
    kill();
    throw err;
  }
  const { table, figures, problems } = renderReport(results);
  console.log(table);
  mkdirSync(dirname(options.output), { recursive: true });
  writeFileSync(options.output, `${JSON.stringify({ figures, problems, machine: results.machine, options: results.options, raw: summarizeRaw(results) }, null, 2)}\n`);
  note(`wrote ${options.output}`);
  for (const p of problems) note(`PROBLEM: ${p}`);
  return problems.length === 0 ? 0 : 1;
}

/** The JSON keeps distributions as percentiles, not every sample. */
function summarizeRaw(r: BenchResults): Record<string, unknown> {
  const drive = (d: DriveResult | undefined) =>
    d && { trajectories: d.trajectories, turns: d.turns, wallMs: d.wallMs, statuses: d.statuses, meanReward: d.meanReward, rejected: d.rejected.slice(0, 10),
      latencyMs: { p50: percentile(d.latenciesMs, 50), p90: percentile(d.latenciesMs, 90), p99: percentile(d.latenciesMs, 99), max: percentile(d.latenciesMs, 100) },
      acceptMs: { p50: percentile(d.acceptMs, 50), p99: percentile(d.acceptMs, 99) },
      serverTotalMs: { p50: percentile(d.serverTotalMs, 50), p99: percentile(d.serverTotalMs, 99) } };
  const { latenciesMs, ...direct } = r.direct;
  return {
    server: { ...drive(r.server), cpuMicros: r.server.cpu, inFlight: r.server.inFlight, eventLoop: r.server.eventLoop, retained: r.server.retained, after: r.server.after },
    direct: { ...direct, latencyMs: { p50: percentile(latenciesMs, 50), p99: percentile(latenciesMs, 99) } },
    hold: r.hold,
    unacked: r.unacked,
    nullSmall: drive(r.nullSmall),
    bwrap: drive(r.bwrap),
    engineBound: r.engineBound.map((p) => ({ serviceMs: p.serviceMs, servers: p.servers, server: { ...drive(p.server), cpuMicros: p.serverCpu },
      direct: { requests: p.direct.requests, wallMs: p.direct.wallMs, errors: p.direct.errors, cpuMicros: p.directCpu,
        latencyMs: { p50: percentile(p.direct.latenciesMs, 50), p99: percentile(p.direct.latenciesMs, 99) } } })),
    long: r.long && Object.fromEntries(Object.entries(r.long).map(([k, p]) => [k, { tokenWorkers: p.tokenWorkers, ...drive(p.drive), eventLoop: p.eventLoop, cpuMicros: p.cpu, contextTokens: p.contextTokens }])),
  };
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
