/**
 * Benchmark child: one real rollout server (startRolloutServer, silent logger) in its own process, so its memory
 * and CPU are measured alone, driven by bench/orchestration.ts over IPC (see child-rpc.ts). Started with
 * `--expose-gc`, so `memory` measures after full collections.
 *
 * argv[2] is a JSON {@link ServerChildOptions}. The registry is the default one plus the benchmark double
 * `bench-calc` (src/testing/calc-environment.ts) and `bench-long-context` (src/testing/long-context-environment.ts); with sandbox 'null' the TEST DOUBLE NullSandboxDriver
 * (src/testing/null-sandbox.ts) replaces bubblewrap, so no process is spawned per trajectory.
 */
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { writeHeapSnapshot } from 'node:v8';
import { Session } from 'node:inspector';
import { constants, monitorEventLoopDelay, performance, PerformanceObserver } from 'node:perf_hooks';
import { startRolloutServer } from '../src/app.js';
import type { ServerConfigInput } from '../src/config.js';
import { defaultRegistry } from '../src/environments/registry.js';
import { silentLogger } from '../src/observability/logger.js';
import type { PoolStats } from '../src/backends/pool.js';
import type { StageStats } from '../src/pipeline/pipeline.js';
import type { TokenPoolStats } from '../src/tokens/token-pool.js';
import { createCalcEnvironment } from '../src/testing/calc-environment.js';
import { createLongContextEnvironment, forgetPreparedLongContext, prepareLongContext, type LongContextInstance } from '../src/testing/long-context-environment.js';
import { NullSandboxDriver } from '../src/testing/null-sandbox.js';
import { BELOW_NORMAL, threadStat } from '../src/thread-priority.js';
import { serveChild } from './child-rpc.js';

export interface ServerChildOptions {
  sandbox: 'null' | 'bwrap';
  config: ServerConfigInput;
}

export interface ServerStats {
  cpu: NodeJS.CpuUsage;
  /** The same CPU split by thread (µs, from /proc/self/task; Linux only, undefined elsewhere). */
  threads: ThreadCpu | undefined;
  inFlight: number;
  admitted: number;
  completedTotal: number;
  storedTasks: number;
  stages: StageStats[];
  pool: PoolStats;
  /** Null sandboxes not stopped yet (undefined with bwrap). */
  liveSandboxes: number | undefined;
  /** Ref'ed TCP sockets (getActiveResourcesInfo): connections with a request or stream open; idle pooled ones are unref'ed. */
  tcpSockets: number;
  /** Bytes of trajectories sent to trainer sessions and not acked (what sessions.maxUnackedBytes bounds). */
  sessions: { unackedBytes: number };
}

/**
 * How busy the server's event loop was since the previous call. Delays are how late a repeating timer ran
 * (monitorEventLoopDelay records the whole interval between its ticks, so its resolution is subtracted): 0 when
 * the loop was never blocked.
 */
export interface EventLoopStats {
  /** Fraction of wall time the loop was running code (performance.eventLoopUtilization); 1 = saturated. */
  utilization: number;
  delayP50Ms: number;
  delayP99Ms: number;
  delayMaxMs: number;
}

export type ServerApi = {
  /** Event-loop utilization and delay since the previous call (the first call starts the window). */
  eventLoop: () => EventLoopStats;
  /** process.memoryUsage() after full garbage collections. */
  memory: () => Promise<NodeJS.MemoryUsage>;
  stats: () => ServerStats;
  /**
   * Heap held by the task store: measures, empties the store, measures again (after full GCs both times). Destroys
   * GetTrajectory's record, so call it only when the server's finished tasks are no longer needed.
   */
  dropTaskStore: () => Promise<{ tasks: number; trajectories: number; heapBytes: number }>;
  /** The server's token threads: how many it runs (0 = none) and their counters. */
  tokenWork: () => { tokenWorkers: number; stats: TokenPoolStats | undefined };
  /** Writes a V8 heap snapshot into `dir` (after full GCs); returns its path. */
  heapSnapshot: (dir: string) => Promise<string>;
  /**
   * Has the long-context double generate ahead the texts of these instances (see prepareLongContext), dropping what
   * it prepared before; returns the characters prepared.
   */
  prepareLongContext: (instances: LongContextInstance[]) => number;
  shutdown: () => Promise<void>;
};

export interface ServerInfo {
  address: string;
  pid: number;
}

const gc = (globalThis as { gc?: () => void }).gc;

/** Threads of the process before the server started (see main). */
const startupThreads = new Set<string>();

/** Interval of the event-loop delay timer, ms. */
const LOOP_RESOLUTION_MS = 10;

async function collect(): Promise<void> {
  if (!gc) throw new Error('server child needs --expose-gc');
  // Several rounds, yielding between them, so objects freed by finalizers and weak maps are collected too.
  for (let i = 0; i < 4; i++) {
    gc();
    await new Promise((resolve) => setImmediate(resolve));
  }
}

/**
 * BENCH_LOOP_TRACE=<dir>: a 2 ms timer notes every tick more than 4 ms late, with what the main thread did meanwhile
 * according to the kernel (/proc/thread-self/schedstat: time on a core, time runnable but waiting for one), and writes
 * the list to <dir>/loop-trace.<pid>.txt at exit. "run" ≈ late is a block of our own; "wait" ≈ late is a busy
 * machine; gc_ms and major_gc_ms: the main isolate's young and full collections in it; token_threads_ms and
 * helpers_ms: what the process's other threads ran meanwhile (the rest of two cores' time went to other processes
 * or was idle). Times are CLOCK_MONOTONIC µs, the clock of V8's CPU profiles (BENCH_CPU_PROF), so a late tick can
 * be looked up in the profile's samples.
 */
const TRACE_TICK_MS = 2;

function traceLateTicks(dir: string): void {
  const schedstat = (): number[] => readFileSync('/proc/thread-self/schedstat', 'utf8').trim().split(' ').map(Number);
  const ticks: { monotonicUs: bigint; from: number; to: number; lateMs: number; runMs: number; waitMs: number; tokenMs: number; helpersMs: number }[] = [];
  const tokenThreads = new Set<string>();
  // The process's other threads (token threads, V8 and libuv helpers): ns on a core so far, by thread id.
  const otherThreads = (): Map<string, number> => {
    const out = new Map<string, number>();
    for (const tid of readdirSync('/proc/self/task')) {
      if (Number(tid) === process.pid) continue;
      try {
        out.set(tid, Number(readFileSync(`/proc/self/task/${tid}/schedstat`, 'utf8').split(' ')[0]));
      } catch {
        // the thread ended meanwhile
      }
    }
    return out;
  };
  // The main isolate's GC pauses (performance entries, delivered after the fact), matched to the ticks at exit.
  const pauses: { start: number; end: number; major: boolean }[] = [];
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      // detail.kind: NODE_PERFORMANCE_GC_MINOR (scavenge), _MAJOR (mark-compact), _INCREMENTAL, _WEAKCB.
      const kind = (e as { detail?: { kind?: number } }).detail?.kind ?? 0;
      pauses.push({ start: e.startTime, end: e.startTime + e.duration, major: kind === constants.NODE_PERFORMANCE_GC_MAJOR });
    }
  }).observe({ entryTypes: ['gc'] });
  let last = performance.now();
  let before = schedstat();
  let othersBefore = otherThreads();
  setInterval(() => {
    const now = performance.now();
    const after = schedstat();
    const othersAfter = otherThreads();
    const lateMs = now - last - TRACE_TICK_MS;
    if (lateMs > 4) {
      const ms = (i: number): number => (after[i]! - before[i]!) / 1e6;
      let tokenMs = 0;
      let helpersMs = 0;
      for (const [tid, ns] of othersAfter) {
        const ran = (ns - (othersBefore.get(tid) ?? ns)) / 1e6;
        // Remembered once known (a token thread is not one until it has lowered its own priority).
        if (ran > 0 && (tokenThreads.has(tid) || (isTokenThread(tid, threadStat(tid)) && tokenThreads.add(tid)))) tokenMs += ran;
        else helpersMs += ran;
      }
      ticks.push({ monotonicUs: process.hrtime.bigint() / 1000n, from: last, to: now, lateMs, runMs: ms(0), waitMs: ms(1), tokenMs, helpersMs });
    }
    last = now;
    before = after;
    othersBefore = othersAfter;
  }, TRACE_TICK_MS).unref();
  process.on('exit', () => {
    const gcMs = (from: number, to: number, major: boolean): string =>
      pauses.reduce((sum, p) => sum + (p.major === major ? Math.max(0, Math.min(to, p.end) - Math.max(from, p.start)) : 0), 0).toFixed(1);
    const lines = ticks.map(
      (t) =>
        `${t.monotonicUs} ${t.lateMs.toFixed(1)} ${t.runMs.toFixed(1)} ${t.waitMs.toFixed(1)} ${gcMs(t.from, t.to, false)} ${gcMs(t.from, t.to, true)} ` +
        `${t.tokenMs.toFixed(1)} ${t.helpersMs.toFixed(1)}`,
    );
    const header = 'monotonic_us late_ms run_ms wait_ms gc_ms major_gc_ms token_threads_ms helpers_ms';
    writeFileSync(`${dir}/loop-trace.${process.pid}.txt`, `${[header, ...lines].join('\n')}\n`);
  });
}

/**
 * BENCH_HEAP_SAMPLE=<dir>: V8's sampling heap profiler from start to shutdown, counting objects a scavenge did not
 * collect (promoted to the old generation, or allocated there or in large-object space) and not those it did: where
 * the memory that survives young collections was allocated (objects that survive one scavenge and die before the
 * next are not counted); with BENCH_HEAP_SAMPLE_ALL=1 every allocation. Written to <dir>/server-<pid>.heapprofile.
 */
function startHeapSampling(dir: string): () => Promise<void> {
  const session = new Session();
  session.connect();
  const post = (method: string, params?: object): Promise<unknown> =>
    new Promise((resolve, reject) => session.post(method, params ?? {}, (err, result) => (err ? reject(err) : resolve(result))));
  void post('HeapProfiler.startSampling', { samplingInterval: 16384, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: process.env.BENCH_HEAP_SAMPLE_ALL === '1' });
  return async () => {
    const { profile } = (await post('HeapProfiler.stopSampling')) as { profile: unknown };
    writeFileSync(join(dir, `server-${process.pid}.heapprofile`), JSON.stringify(profile));
  };
}

async function main(): Promise<void> {
  const options = JSON.parse(process.argv[2] ?? '{}') as ServerChildOptions;
  // Threads the process had before the server started (V8's workers, libuv's pool, tsx's loader): helpers, even
  // once the server lowers them to the token threads' priority (src/thread-priority.ts).
  for (const tid of readdirSync('/proc/self/task')) startupThreads.add(tid);
  const registry = defaultRegistry().register(createCalcEnvironment()).register(createLongContextEnvironment());
  const nullSandboxes = options.sandbox === 'null' ? new NullSandboxDriver() : undefined;
  const server = await startRolloutServer(
    { ...options.config, port: 0 },
    { logger: silentLogger(), registry, ...(nullSandboxes && { sandboxes: nullSandboxes }) },
  );
  const { runtime, pool } = server;
  const delay = monitorEventLoopDelay({ resolution: LOOP_RESOLUTION_MS });
  const late = (ns: number): number => Math.max(0, ns / 1e6 - LOOP_RESOLUTION_MS);
  delay.enable();
  if (process.env.BENCH_LOOP_TRACE) traceLateTicks(process.env.BENCH_LOOP_TRACE);
  const stopHeapSampling = process.env.BENCH_HEAP_SAMPLE ? startHeapSampling(process.env.BENCH_HEAP_SAMPLE) : undefined;
  let elu = performance.eventLoopUtilization();
  const api: ServerApi = {
    memory: async () => {
      await collect();
      return process.memoryUsage();
    },
    eventLoop: () => {
      const out: EventLoopStats = {
        utilization: performance.eventLoopUtilization(elu).utilization,
        delayP50Ms: late(delay.percentile(50)),
        delayP99Ms: late(delay.percentile(99)),
        delayMaxMs: late(delay.max),
      };
      elu = performance.eventLoopUtilization();
      delay.reset();
      return out;
    },
    stats: () => ({
      cpu: process.cpuUsage(),
      threads: threadCpu(),
      inFlight: runtime.pipeline.inFlight,
      admitted: runtime.admission.inFlight,
      completedTotal: runtime.pipeline.completedTotal,
      storedTasks: runtime.store.size,
      stages: runtime.pipeline.stageStats(),
      pool: pool.stats(),
      liveSandboxes: nullSandboxes?.live,
      tcpSockets: process.getActiveResourcesInfo().filter((r) => r === 'TCPSocketWrap').length,
      sessions: { unackedBytes: server.sessions.stats().unackedBytes },
    }),
    dropTaskStore: async () => {
      const before = (await api.memory()).heapUsed;
      const { tasks, trajectories } = runtime.store.dropFinished();
      const after = (await api.memory()).heapUsed;
      return { tasks, trajectories, heapBytes: before - after };
    },
    tokenWork: () => ({ tokenWorkers: server.tokenPool?.size ?? 0, stats: server.tokenPool?.stats() }),
    heapSnapshot: async (dir) => {
      await collect();
      return writeHeapSnapshot(join(dir, `server-${process.pid}-${Date.now()}.heapsnapshot`));
    },
    prepareLongContext: (instances) => {
      forgetPreparedLongContext();
      return prepareLongContext(instances);
    },
    shutdown: async () => {
      await stopHeapSampling?.();
      await server.shutdown();
      setImmediate(() => process.exit(0));
    },
  };
  await serveChild<ServerInfo>(Promise.resolve({ address: server.address, pid: process.pid }), api);
}

void main().catch((err: unknown) => {
  console.error('server child failed:', err);
  process.exit(1);
});

/**
 * CPU time (µs) of this process by thread: the event loop (the main thread), the token threads (isTokenThread) and
 * the rest (V8's GC and compiler threads, libuv's pool).
 */
export interface ThreadCpu {
  main: number;
  tokenThreads: number;
  helpers: number;
}

const TICK_MICROS = 10_000; // USER_HZ = 100 on Linux

/**
 * Token threads: started after the server (so not a V8 worker, libuv's pool or tsx's loader) and below normal
 * priority (token-worker.ts lowers its own once started; a libuv thread started later stays at normal).
 */
function isTokenThread(tid: string, stat: string[] | undefined): boolean {
  return !startupThreads.has(tid) && Number(stat?.[16] ?? 0) >= BELOW_NORMAL;
}

function threadCpu(): ThreadCpu | undefined {
  let tids: string[];
  try {
    tids = readdirSync('/proc/self/task');
  } catch {
    return undefined;
  }
  const out: ThreadCpu = { main: 0, tokenThreads: 0, helpers: 0 };
  for (const tid of tids) {
    const f = threadStat(tid);
    if (!f) continue; // the thread ended meanwhile
    const micros = (Number(f[11]) + Number(f[12])) * TICK_MICROS;
    if (Number(tid) === process.pid) out.main += micros;
    else if (isTokenThread(tid, f)) out.tokenThreads += micros;
    else out.helpers += micros;
  }
  return out;
}
