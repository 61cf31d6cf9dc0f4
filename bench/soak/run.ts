import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import type { ServerConfigInput } from '../../src/config.js';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { ChildHandle } from '../child-rpc.js';
import { note } from '../progress.js';
import { machineBusyMicros } from '../system-load.js';
import type { SoakEngineApi, SoakEngineInfo } from './engine.js';
import { descendants, processesInSandboxCgroupsOf, processesWithEnv, sampleProcess, sandboxCgroupsOf, sandboxMountsOf, type HostProcessInfo, type ProcessSample } from './host.js';
import { SoakLoad, type LoadCounts, type ReconnectNote } from './load.js';
import { RUN_TAG_ENV, SOAK_CALC_ENVIRONMENT } from './names.js';
import { ServerProcess } from './server-process.js';

export interface SoakOptions {
  /** Length of the load phase (the drain comes after it). */
  minutes: number;
  /** Samples in flight across all sessions. */
  concurrency: number;
  sessions: number;
  groupSize: number;
  /** Every k-th task runs `math` in bubblewrap; the rest `soak-calc` in a null sandbox. */
  sandboxEvery: number;
  /** Fraction of the load phase at which the server is killed -9 and restarted; undefined: no kill. */
  killAt: number | undefined;
  journalDir: string | undefined;
  sampleSeconds: number;
  drainTimeoutMs: number;
  /** Grace for the final SIGTERM shutdown before the server is killed. */
  stopGraceMs: number;
  /** Progress lines on stderr. */
  verbose: boolean;
}

export interface MemorySample {
  /** Seconds since the load started. */
  t: number;
  phase: 'before' | 'after';
  pid: number;
  rss: number;
  /** The server's live V8 heap (heapUsed after the full collection the server runs every 10 s), bytes. */
  heapUsed: number;
  /** CPU seconds the server process has used so far. */
  cpuSeconds: number;
  /** CPU seconds the whole machine had used (from /proc/stat), to tell how busy the rest of it was. */
  machineCpuSeconds: number;
  fds: number;
  threads: number;
  inflight: number;
  received: number;
}

export interface LeftoverReport {
  /** Sandbox cgroup directories of each server process (dead or stopped). */
  cgroups: string[];
  /** Processes still in those cgroups. */
  cgroupProcesses: HostProcessInfo[];
  /** Processes carrying the run's sandbox tag anywhere on the host. */
  taggedProcesses: HostProcessInfo[];
  /** Image mounts (squashfuse) of those server processes left in the mount table. */
  mounts: string[];
  /** Live descendants of the bench process once everything was stopped. */
  children: HostProcessInfo[];
}

export interface SoakResult {
  options: SoakOptions;
  runTag: string;
  workDir: string;
  serverPids: number[];
  loadSeconds: number;
  counts: LoadCounts;
  reconnects: ReconnectNote[];
  /** Kill -9 → restarted server listening, ms. */
  restartMs: number | undefined;
  /** What the killed server's sandboxes left right after the restarted one started (it reaps at start-up). */
  afterRestartReap: Omit<LeftoverReport, 'children'> | undefined;
  finalStop: { exitMs: number; forced: boolean; code: number | null; signal: string | null };
  leftovers: LeftoverReport;
  samples: MemorySample[];
  latencyMs: { p50: number; p90: number; p99: number; count: number };
  /** Submit → accepted: how long a task waited for the server to read and admit it. */
  acceptMs: { p50: number; p90: number; p99: number; count: number };
  /** Finished on the server → received by the client (see SoakLoad.deliveryMs). */
  deliveryMs: { p50: number; p90: number; p99: number; count: number };
  tasksPerSecond: number;
  trajectoriesPerSecond: number;
  /**
   * The lowest RSS (MiB) in each third of each steady phase. V8 lets the heap grow to a limit and then collects it,
   * so RSS is a sawtooth and a line fitted through it swings with where the teeth fall; the troughs (after major
   * collections) are what a leak raises.
   */
  rssTroughsMiB: { before: number[]; after: number[] };
  /** The same for the server's V8 heap in use: what a leak of JavaScript objects raises, without RSS's noise. */
  heapTroughsMiB: { before: number[]; after: number[] };
  /** Linear fit of the server's RSS over each steady phase, MiB per minute. */
  rssSlopeMiBPerMin: { before: number | undefined; after: number | undefined };
  rss: { minMiB: number; maxMiB: number };
  /**
   * Server CPU per trajectory over each steady phase (ms), and the cores the rest of the machine used meanwhile:
   * wall-clock figures are only comparable when `otherCores` is small (other work shares the 2 cores).
   */
  cpu: { serverMsPerTrajectory: number | undefined; serverCores: number | undefined; otherCores: number | undefined };
  /**
   * The client (this process) over the load phase: cores it used and how late its event loop ran (a starved or
   * busy client delays reading trajectories, which shows up as delivery time).
   */
  client: { cores: number; loopDelayP50Ms: number; loopDelayP99Ms: number; loopDelayMaxMs: number };
  engine: { received: number; served: number; failed: number; disconnected: number };
  /** Every accounting rule that failed, in words; empty when the run is clean. */
  problems: string[];
}

const MIB = 1024 * 1024;

/**
 * The soak: a fake-engine process, the server as a real process, a client holding `concurrency` samples in flight
 * over several sessions for `minutes`, optionally a kill -9 and restart of the server midway; then a drain, a
 * SIGTERM stop, and the accounting (every task in exactly one state, no duplicate after an ack, no leftover
 * sandbox, cgroup, mount or process, the server's memory over time). Never asserts timings.
 */
export async function runSoak(o: SoakOptions): Promise<SoakResult> {
  const runTag = randomUUID();
  const workDir = mkdtempSync(join(tmpdir(), 'rollout-soak-'));
  const logPath = join(workDir, 'server.log');
  const say = (message: string): void => {
    if (o.verbose) note(message);
  };
  // tsx's esbuild service and the like: children the bench had before it started anything.
  const before = new Set(descendants(process.pid).map((p) => p.pid));
  const engine = await ChildHandle.spawn<SoakEngineApi, SoakEngineInfo>('soak-engine', new URL('./engine.ts', import.meta.url), []);
  const config: ServerConfigInput = {
    port: 0,
    model: { name: engine.info.model },
    backends: [{ url: engine.info.url, maxConcurrency: o.concurrency + 256 }],
    init: { concurrency: 256 },
    run: { concurrency: o.concurrency + 256 },
    eval: { concurrency: 256 },
    maxAdmitted: Math.max(20_000, 2 * o.concurrency),
    // Bubblewrap sandboxes only for `math`; each is small (a python one-liner).
    sandbox: { memoryMb: 256, maxProcesses: 32 },
  };
  const configPath = join(workDir, 'server.json');
  writeFileSync(configPath, JSON.stringify(config, null, 2));
  const start = (): Promise<ServerProcess> => ServerProcess.start({ configPath, runTag, logPath, ...(o.journalDir !== undefined && { journalDir: o.journalDir }) });
  let server = await start();
  const serverPids = [server.pid];
  say(`soak: engine ${engine.info.url} (pid ${engine.pid}), server ${server.address} (pid ${server.pid}), log ${logPath}`);
  let client = new RolloutClient(server.address);
  const load = new SoakLoad(client, {
    sessions: o.sessions,
    concurrency: o.concurrency,
    groupSize: o.groupSize,
    sandboxEvery: o.sandboxEvery,
    calcEnvironment: SOAK_CALC_ENVIRONMENT,
    prefix: `soak-${runTag.slice(0, 8)}`,
  });

  const samples: MemorySample[] = [];
  const loopDelay = monitorEventLoopDelay({ resolution: 20 });
  loopDelay.enable();
  const clientCpu = process.cpuUsage();
  const loadStarted = performance.now();
  let phase: MemorySample['phase'] = 'before';
  let serverAlive = true;
  let clean = false;
  const sample = (): void => {
    if (!serverAlive) return;
    const s: ProcessSample | undefined = sampleProcess(server.pid);
    if (!s) return;
    samples.push({ t: (performance.now() - loadStarted) / 1000, phase, pid: server.pid, rss: s.rss, heapUsed: heapUsedOf(workDir, server.pid), cpuSeconds: s.cpuSeconds, machineCpuSeconds: (machineBusyMicros() ?? NaN) / 1e6, fds: s.fds, threads: s.threads, inflight: load.inflight, received: load.received });
    if (o.verbose) say(`soak: t=${samples.at(-1)!.t.toFixed(0)}s ${phase} rss ${(s.rss / MIB).toFixed(0)} MiB heap ${(samples.at(-1)!.heapUsed / MIB).toFixed(0)} MiB fds ${s.fds} in flight ${load.inflight} received ${load.received}`);
  };
  const sampler = setInterval(sample, o.sampleSeconds * 1000);
  const running = load.run();
  const loadMs = o.minutes * 60_000;
  let restartMs: number | undefined;
  let afterRestartReap: SoakResult['afterRestartReap'];
  let killT: number | undefined;
  let restartT: number | undefined;
  try {
    if (o.killAt !== undefined) {
      await sleep(loadMs * o.killAt);
      const dead = server;
      say(`soak: kill -9 server pid ${dead.pid} with ${load.inflight} samples in flight`);
      sample();
      load.serverKilled();
      serverAlive = false;
      killT = (performance.now() - loadStarted) / 1000;
      const killed = performance.now();
      await dead.kill9();
      client.close();
      server = await start();
      serverPids.push(server.pid);
      restartMs = performance.now() - killed;
      restartT = (performance.now() - loadStarted) / 1000;
      phase = 'after';
      serverAlive = true;
      // The restarted server reaped its predecessor's sandboxes before it listened.
      afterRestartReap = leftoversOf([dead.pid], runTag);
      say(`soak: restarted as pid ${server.pid} in ${restartMs.toFixed(0)} ms; the killed server left ${afterRestartReap.cgroups.length} cgroups, ${afterRestartReap.cgroupProcesses.length} processes`);
      client = new RolloutClient(server.address);
      load.reconnect(client);
      await sleep(Math.max(0, loadMs - (performance.now() - loadStarted)));
    } else {
      await sleep(loadMs);
    }
    sample();
    const loadSeconds = (performance.now() - loadStarted) / 1000;
    loopDelay.disable();
    const cpuUsed = process.cpuUsage(clientCpu);
    // The histogram holds whole intervals between ticks: the resolution is subtracted, so 0 means never late.
    const late = (ns: number): number => Math.max(0, ns / 1e6 - 20);
    const clientFigures = {
      cores: (cpuUsed.user + cpuUsed.system) / 1e6 / loadSeconds,
      loopDelayP50Ms: late(loopDelay.percentile(50)),
      loopDelayP99Ms: late(loopDelay.percentile(99)),
      loopDelayMaxMs: late(loopDelay.max),
    };
    say(`soak: load phase over after ${loadSeconds.toFixed(0)} s; draining ${load.inflight} samples`);
    load.finish(o.drainTimeoutMs);
    await running;
    clearInterval(sampler);
    sample();
    const finalStop = await server.terminate(o.stopGraceMs);
    serverAlive = false;
    client.close();
    const e = await engine.call('stats');
    const engineStats = { received: e.received, served: e.served, failed: e.failed, disconnected: e.disconnected };
    await engine.stop('shutdown');
    const leftovers: LeftoverReport = { ...leftoversOf(serverPids, runTag), children: await settledChildren(before) };
    const counts = load.tally();
    const percentiles = (values: readonly number[]): SoakResult['latencyMs'] => {
      const sorted = [...values].sort((a, b) => a - b);
      const pct = (p: number): number => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;
      return { p50: pct(50), p90: pct(90), p99: pct(99), count: sorted.length };
    };
    const rssValues = samples.map((s) => s.rss);
    const wall = loadSeconds;
    // The steady part of a phase: its first quarter (and at least 10 s) is warm-up.
    const steady = (from: number, to: number, which: MemorySample['phase']): MemorySample[] =>
      samples.filter((s) => s.phase === which && s.t >= from + Math.max(10, (to - from) / 4) && s.t <= to);
    const slope = (from: number, to: number, which: MemorySample['phase']): number | undefined => fitSlope(steady(from, to, which));
    const troughs = (points: readonly MemorySample[], of: (p: MemorySample) => number = (p) => p.rss): number[] => {
      if (points.length < 3) return [];
      const third = Math.ceil(points.length / 3);
      return [0, 1, 2].map((i) => Math.min(...points.slice(i * third, (i + 1) * third).map(of).filter(Number.isFinite)) / MIB).filter(Number.isFinite);
    };
    const result: SoakResult = {
      options: o,
      runTag,
      workDir,
      serverPids,
      loadSeconds,
      counts,
      reconnects: load.reconnects,
      restartMs,
      afterRestartReap,
      finalStop,
      leftovers,
      samples,
      latencyMs: percentiles(load.latenciesMs),
      acceptMs: percentiles(load.acceptMs),
      deliveryMs: percentiles(load.deliveryMs),
      tasksPerSecond: counts.byState.finished / wall,
      trajectoriesPerSecond: counts.trajectoriesReceived / wall,
      rssTroughsMiB: {
        before: troughs(steady(0, killT ?? loadSeconds, 'before')),
        after: restartT !== undefined ? troughs(steady(restartT, loadSeconds, 'after')) : [],
      },
      heapTroughsMiB: {
        before: troughs(steady(0, killT ?? loadSeconds, 'before'), (p) => p.heapUsed),
        after: restartT !== undefined ? troughs(steady(restartT, loadSeconds, 'after'), (p) => p.heapUsed) : [],
      },
      rssSlopeMiBPerMin: {
        before: slope(0, killT ?? loadSeconds, 'before'),
        after: restartT !== undefined ? slope(restartT, loadSeconds, 'after') : undefined,
      },
      rss: { minMiB: Math.min(...rssValues) / MIB, maxMiB: Math.max(...rssValues) / MIB },
      cpu: cpuOf(samples.filter((s) => s.phase === 'before')),
      client: clientFigures,
      engine: engineStats,
      problems: [],
    };
    result.problems = problemsOf(result);
    clean = result.problems.length === 0;
    return result;
  } finally {
    clearInterval(sampler);
    client.close();
    if (serverAlive) await server.terminate(5_000).catch(() => undefined);
    engine.kill();
    // The server's log and config are kept to be read only when the run went wrong (the result names the directory).
    if (clean) rmSync(workDir, { recursive: true, force: true });
  }
}

function leftoversOf(pids: readonly number[], runTag: string): Omit<LeftoverReport, 'children'> {
  return {
    cgroups: pids.flatMap((pid) => sandboxCgroupsOf(pid)),
    cgroupProcesses: pids.flatMap((pid) => processesInSandboxCgroupsOf(pid)),
    taggedProcesses: processesWithEnv(RUN_TAG_ENV, runTag),
    mounts: pids.flatMap((pid) => sandboxMountsOf(pid)),
  };
}

/** Descendants of this process, given a moment to be reaped (a child that just exited may still be listed). */
async function settledChildren(before: ReadonlySet<number>): Promise<HostProcessInfo[]> {
  const left = (): HostProcessInfo[] => descendants(process.pid).filter((p) => !before.has(p.pid));
  for (let i = 0; i < 20 && left().length > 0; i++) await sleep(250);
  return left();
}

/** CPU use between the first and last sample of one server process (same pid). */
function cpuOf(points: readonly MemorySample[]): SoakResult['cpu'] {
  const first = points[0];
  const last = points.at(-1);
  if (!first || !last || last.t <= first.t) return { serverMsPerTrajectory: undefined, serverCores: undefined, otherCores: undefined };
  const wall = last.t - first.t;
  const server = last.cpuSeconds - first.cpuSeconds;
  const machine = last.machineCpuSeconds - first.machineCpuSeconds;
  const trajectories = last.received - first.received;
  return {
    serverMsPerTrajectory: trajectories > 0 ? (server * 1000) / trajectories : undefined,
    serverCores: server / wall,
    // Ours: the server; the client and engine are counted as "others" too (they are small next to the server).
    otherCores: Number.isNaN(machine) ? undefined : Math.max(0, machine - server) / wall,
  };
}

/** Least-squares slope of RSS over time, MiB per minute; undefined with fewer than 3 samples. */
export function fitSlope(points: readonly MemorySample[]): number | undefined {
  if (points.length < 3) return undefined;
  const n = points.length;
  const mx = points.reduce((a, p) => a + p.t, 0) / n;
  const my = points.reduce((a, p) => a + p.rss, 0) / n;
  let num = 0;
  let den = 0;
  for (const p of points) {
    num += (p.t - mx) * (p.rss - my);
    den += (p.t - mx) ** 2;
  }
  return den === 0 ? undefined : ((num / den) * 60) / MIB;
}

/** The accounting rules, each broken one in words. */
function problemsOf(r: SoakResult): string[] {
  const c = r.counts;
  const out: string[] = [];
  const states = Object.values(c.byState).reduce((a, b) => a + b, 0);
  if (states !== c.tasksSubmitted) out.push(`tasks in states ${states} != submitted ${c.tasksSubmitted}`);
  if (c.byState.missing > 0) out.push(`${c.byState.missing} accepted tasks never delivered nor reported lost (e.g. ${c.examples.join(', ')})`);
  // Without a journal a restart loses what was accepted: reported (as the figure it is), a failure only with one.
  if (c.byState.lost > 0 && r.options.journalDir !== undefined) out.push(`${c.byState.lost} accepted tasks lost across the restart despite the journal`);
  if (c.byState.sent > 0 || c.byState.accepted > 0) out.push(`${c.byState.sent + c.byState.accepted} tasks unsettled`);
  if (c.duplicatesAfterAck > 0) {
    out.push(`${c.duplicatesAfterAck} trajectories delivered again after the server had read their ack (it answered a task written after the ack on the same stream)`);
  }
  if (c.redeliveredAckInFlight > 0) out.push(`${c.redeliveredAckInFlight} trajectories delivered twice on a live stream`);
  if (c.unknownTrajectories > 0) out.push(`${c.unknownTrajectories} trajectories of unknown tasks`);
  if (c.malformedTrajectories > 0) out.push(`${c.malformedTrajectories} trajectories with token arrays of different lengths`);
  const finishedSamples = c.byState.finished * r.options.groupSize;
  if (c.trajectoriesReceived !== finishedSamples) out.push(`trajectories received ${c.trajectoriesReceived} != samples of finished tasks ${finishedSamples}`);
  const l = r.leftovers;
  if (l.cgroups.length > 0) out.push(`sandbox cgroups left: ${l.cgroups.join(', ')}`);
  if (l.cgroupProcesses.length > 0) out.push(`processes left in sandbox cgroups: ${l.cgroupProcesses.map((p) => `${p.pid} ${p.comm}`).join(', ')}`);
  if (l.taggedProcesses.length > 0) out.push(`sandboxed processes left: ${l.taggedProcesses.map((p) => `${p.pid} ${p.comm}`).join(', ')}`);
  if (l.mounts.length > 0) out.push(`mounts left: ${l.mounts.length}`);
  if (l.children.length > 0) out.push(`bench child processes left: ${l.children.map((p) => `${p.pid} ${p.comm}`).join(', ')}`);
  if (r.finalStop.forced) out.push(`the server did not exit within ${r.options.stopGraceMs} ms of SIGTERM (killed)`);
  else if (r.finalStop.code !== 0) out.push(`the server exited with code ${r.finalStop.code} signal ${r.finalStop.signal} after SIGTERM`);
  return out;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** The heap the server process last wrote (bench/soak/server.ts), or NaN before its first write. */
function heapUsedOf(dir: string, pid: number): number {
  try {
    return (JSON.parse(readFileSync(join(dir, `heap-${pid}.json`), 'utf8')) as { heapUsed: number }).heapUsed;
  } catch {
    return NaN;
  }
}
