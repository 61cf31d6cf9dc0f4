import type { BenchResults, CpuSpent, EngineBoundPass, LongPass } from './orchestration.js';
import { percentile, type DriveResult, type ReplayResult } from './drive.js';

/** Figures of one run, flat, for the JSON file and for comparing runs. */
export type Figures = Record<string, number | string>;

const KIB = 1024;

/** Renders rows as aligned columns: the first left-aligned, the others right-aligned. */
function table(rows: readonly (readonly string[])[]): string {
  const widths: number[] = [];
  for (const row of rows) row.forEach((cell, i) => (widths[i] = Math.max(widths[i] ?? 0, cell.length)));
  return rows.map((row) => row.map((cell, i) => (i === 0 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!))).join('  ').trimEnd()).join('\n');
}

const f0 = (x: number): string => x.toFixed(0);
const f1 = (x: number): string => x.toFixed(1);
const f2 = (x: number): string => x.toFixed(2);
const kib = (bytes: number): string => `${(bytes / KIB).toFixed(1)} KiB`;
const signedKib = (bytes: number): string => `${bytes >= 0 ? '+' : '-'}${kib(Math.abs(bytes))}`;
/** Mean number of cores other processes kept busy during a pass (they compete with ours for the 2 cores). */
const cores = (c: CpuSpent): string => (Number.isNaN(c.others) ? 'n/a' : (c.others / c.wallMicros).toFixed(2));
const statusList = (s: Record<string, number>): string => Object.entries(s).map(([k, v]) => `${k} ${v}`).join(', ') || '-';
const notCompleted = (d: DriveResult): number => d.trajectories - (d.statuses.COMPLETED ?? 0);
const infraFailures = (d: DriveResult): number => d.trajectories - (d.statuses.COMPLETED ?? 0) - (d.statuses.TRUNCATED ?? 0);

const LONG_ENV = 'bench-long-context';

/** Where a long pass's CPU went, per trajectory: the server by thread, then the engine double and the client. */
function longCpuRow(pass: LongPass): string[] {
  const perTrajectory = (micros: number): string => `${f0(micros / 1000 / Math.max(1, pass.drive.trajectories))}`;
  const t = pass.cpu.serverThreads;
  return [
    pass.tokenWorkers === 0 ? 'all token work on the event loop' : `${pass.tokenWorkers} token thread${pass.tokenWorkers === 1 ? '' : 's'} (default)`,
    t ? perTrajectory(t.main) : '-',
    t ? perTrajectory(t.tokenThreads) : '-',
    t ? perTrajectory(t.helpers) : '-',
    perTrajectory(pass.cpu.engine),
    perTrajectory(pass.cpu.client),
  ];
}

function longRow(pass: LongPass, concurrency: number): string[] {
  const d = pass.drive;
  return [
    pass.tokenWorkers === 0 ? 'all token work on the event loop' : `${pass.tokenWorkers} token thread${pass.tokenWorkers === 1 ? '' : 's'} (default)`,
    String(d.trajectories),
    String(concurrency),
    f1(d.wallMs / 1000),
    `${f0(pass.contextTokens.mean)} mean, ${f0(pass.contextTokens.max)} max`,
    f1(pass.eventLoop.delayP50Ms),
    f1(pass.eventLoop.delayP99Ms),
    f1(pass.eventLoop.delayMaxMs),
    f2(pass.eventLoop.utilization),
    `${f0(pass.cpu.server / 1000 / Math.max(1, d.trajectories))} ms`,
    cores(pass.cpu),
    statusList(d.statuses),
  ];
}

/**
 * The report: one table (stdout), the flat figures (JSON) and the problems found (failed trajectories, leaked
 * sandboxes or leases, request count mismatches). Timings are printed, never judged.
 */
export function renderReport(r: BenchResults): { table: string; figures: Figures; problems: string[] } {
  const { server: s, direct: d, hold: h, options: o } = r;
  const problems: string[] = [];
  const sec = (ms: number): number => ms / 1000;

  const serverTrajPerS = s.trajectories / sec(s.wallMs);
  const serverTurnsPerS = s.turns / sec(s.wallMs);
  const directReqPerS = d.requests / sec(d.wallMs);
  const ratio = serverTurnsPerS / directReqPerS;

  problems.push(...passProblems('server pass', 'direct pass', s, d, o.trajectories));
  for (const [when, st] of [['after the server pass', s.after], ['after the memory phase', h.serverAfter]] as const) {
    if (st.inFlight !== 0 || st.admitted !== 0) problems.push(`${when}: ${st.inFlight} samples still in the pipeline, ${st.admitted} admitted`);
    if (st.liveSandboxes) problems.push(`${when}: ${st.liveSandboxes} sandboxes not stopped`);
    if (st.pool.leases !== 0 || st.pool.inflightRequests !== 0) problems.push(`${when}: ${st.pool.leases} backend leases, ${st.pool.inflightRequests} requests not released`);
  }
  if ((h.statuses.CANCELLED ?? 0) !== h.held) problems.push(`memory phase: held trajectories ended as ${statusList(h.statuses)}, expected ${h.held} CANCELLED`);
  if (h.serverDuring.inFlight !== h.held) problems.push(`memory phase: server had ${h.serverDuring.inFlight} in flight, expected ${h.held}`);
  for (const [name, pass, strict] of [['null-sandbox small pass', r.nullSmall, true], ['bwrap pass', r.bwrap, false]] as const) {
    if (!pass) continue;
    if (pass.trajectories !== o.sandboxTrajectories) problems.push(`${name} delivered ${pass.trajectories}/${o.sandboxTrajectories}`);
    const bad = strict ? notCompleted(pass) : infraFailures(pass);
    if (bad > 0) problems.push(`${name}: ${bad} ${strict ? 'not COMPLETED' : 'infrastructure failures'} (${statusList(pass.statuses)})`);
  }

  const perHeld = (key: 'heapUsed' | 'rss'): number => (h.during[key] - h.base[key]) / h.held;
  // `external` includes `arrayBuffers` (Node's docs); adding them counted every ArrayBuffer twice before 2026-12-01.
  const offHeap = (m: NodeJS.MemoryUsage): number => m.external;
  const figures: Figures = {
    cpus: Number(r.machine.cpus),
    serverTrajectories: s.trajectories,
    concurrency: o.concurrency,
    groupSize: o.groupSize,
    serverWallS: sec(s.wallMs),
    serverTrajectoriesPerS: serverTrajPerS,
    serverTurnsPerS,
    serverLatencyP50Ms: percentile(s.latenciesMs, 50),
    serverLatencyP99Ms: percentile(s.latenciesMs, 99),
    serverAcceptP50Ms: percentile(s.acceptMs, 50),
    serverPipelineP50Ms: percentile(s.serverTotalMs, 50),
    serverMeanInFlight: s.inFlight.meanTrajectories,
    serverMaxInFlight: s.inFlight.maxTrajectories,
    serverMeanEngineRequests: s.inFlight.meanEngineRequests,
    serverEventLoopUtilization: s.eventLoop.utilization,
    serverEventLoopDelayP99Ms: s.eventLoop.delayP99Ms,
    serverMeanInboundBacklog: s.inFlight.meanInbound,
    serverMeanOutboundBacklog: s.inFlight.meanOutbound,
    directRequests: d.requests,
    directWallS: sec(d.wallMs),
    directRequestsPerS: directReqPerS,
    directRequestsPerSSlowestPass: d.requests / sec(Math.max(...d.passesWallMs)),
    directRequestsPerSFastestPass: d.requests / sec(Math.min(...d.passesWallMs)),
    directLatencyP50Ms: percentile(d.latenciesMs, 50),
    directLatencyP99Ms: percentile(d.latenciesMs, 99),
    ratioServerTurnsToDirectRequests: ratio,
    serverCpuMicrosPerTurn: s.cpu.server / s.turns,
    otherProcessesCoresDuringServerPass: s.cpu.others / s.cpu.wallMicros,
    otherProcessesCoresDuringDirectPass: d.cpu.others / d.cpu.wallMicros,
    engineCpuMicrosPerRequestViaServer: s.cpu.engine / s.turns,
    clientCpuMicrosPerTrajectory: s.cpu.client / s.trajectories,
    engineCpuMicrosPerRequestDirect: d.cpu.engine / d.requests,
    directClientCpuMicrosPerRequest: d.cpu.client / d.requests,
    heldInFlight: h.held,
    heapBytesPerInFlightTrajectory: perHeld('heapUsed'),
    rssBytesPerInFlightTrajectory: perHeld('rss'),
    offHeapBytesPerInFlightTrajectory: (offHeap(h.during) - offHeap(h.base)) / h.held,
    heapBytesLeftAfterEnd: h.after.heapUsed - h.base.heapUsed,
    heapBytesLeftAfterSettle: h.settled.heapUsed - h.base.heapUsed,
    retainedHeapBytesPerFinishedTrajectory: s.retained.heapBytes / s.retained.trajectories,
    unackedTrajectories: r.unacked.count,
    heapBytesPerUnackedTrajectory: (r.unacked.unacked.heapUsed - r.unacked.acked.heapUsed) / r.unacked.count,
    offHeapBytesPerUnackedTrajectory: (offHeap(r.unacked.unacked) - offHeap(r.unacked.acked)) / r.unacked.count,
    countedBytesPerUnackedTrajectory: r.unacked.unackedBytes / r.unacked.count,
  };
  const small = (name: string, pass: DriveResult | undefined): string[][] => {
    if (!pass) return [];
    figures[`${name}TrajectoriesPerS`] = pass.trajectories / sec(pass.wallMs);
    figures[`${name}TurnsPerS`] = pass.turns / sec(pass.wallMs);
    figures[`${name}LatencyP50Ms`] = percentile(pass.latenciesMs, 50);
    return [[name === 'bwrap' ? 'bwrap sandboxes + math (python tool)' : 'null sandboxes + bench-calc (in-process tool)', String(pass.trajectories), String(o.sandboxConcurrency),
      f1(sec(pass.wallMs)), f1(pass.trajectories / sec(pass.wallMs)), f1(pass.turns / sec(pass.wallMs)), f0(percentile(pass.latenciesMs, 50)),
      f0(percentile(pass.latenciesMs, 99)), statusList(pass.statuses)]];
  };
  const sandboxRows = [...small('nullSmall', r.nullSmall), ...small('bwrap', r.bwrap)];
  const longRows: string[][] = [];
  const longCpuRows: string[][] = [];
  for (const [name, pass] of r.long ? ([['Threads', r.long.threads], ['Inline', r.long.inline]] as const) : []) {
    if (pass.drive.trajectories !== o.longTrajectories) problems.push(`long-context pass (${pass.tokenWorkers} token threads) delivered ${pass.drive.trajectories}/${o.longTrajectories}`);
    if (notCompleted(pass.drive) > 0) {
      problems.push(`long-context pass (${pass.tokenWorkers} token threads): ${notCompleted(pass.drive)} not COMPLETED (${statusList(pass.drive.statuses)}), e.g. ${pass.drive.errors[0] ?? '?'}`);
    }
    figures[`long${name}TokenWorkers`] = pass.tokenWorkers;
    figures[`long${name}EventLoopDelayP50Ms`] = pass.eventLoop.delayP50Ms;
    figures[`long${name}EventLoopDelayP99Ms`] = pass.eventLoop.delayP99Ms;
    figures[`long${name}EventLoopDelayMaxMs`] = pass.eventLoop.delayMaxMs;
    figures[`long${name}EventLoopUtilization`] = pass.eventLoop.utilization;
    figures[`long${name}ContextTokensMean`] = pass.contextTokens.mean;
    figures[`long${name}ServerCpuMsPerTrajectory`] = pass.cpu.server / 1000 / Math.max(1, pass.drive.trajectories);
    const t = pass.cpu.serverThreads;
    if (t) {
      figures[`long${name}ServerMainThreadCpuMsPerTrajectory`] = t.main / 1000 / Math.max(1, pass.drive.trajectories);
      figures[`long${name}ServerTokenThreadsCpuMsPerTrajectory`] = t.tokenThreads / 1000 / Math.max(1, pass.drive.trajectories);
      figures[`long${name}ServerHelperThreadsCpuMsPerTrajectory`] = t.helpers / 1000 / Math.max(1, pass.drive.trajectories);
    }
    longRows.push(longRow(pass, o.longConcurrency));
    longCpuRows.push(longCpuRow(pass));
  }

  const cpuPerTurn = s.cpu.server / s.turns;
  const ratioModel = cpuBoundRatio(s, d);
  figures.ratioCpuModel = ratioModel.model;
  figures.ratioCeilingWithFreeServer = ratioModel.ceiling;
  figures.serverCpuMicrosPerTurnForRatio06 = ratioModel.serverBudgetFor06;
  const longP99 = r.long?.threads.eventLoop.delayP99Ms;
  const targets: string[][] = [
    ['target (issue [4/10] item 8)', 'this run', 'target', 'verdict'],
    ['server CPU per LLM turn (server pass)', `${f0(cpuPerTurn)} µs`, '<= 500 µs', cpuPerTurn <= 500 ? 'met' : `not met (${f2(cpuPerTurn / 500)}x)`],
    ['orchestration ratio (server turns/s / direct req/s)', f2(ratio), '>= 0.60', ratio >= 0.6 ? 'met' : `not met (${f2(ratio / 0.6)} of it)`],
    [
      'event-loop delay p99, 64K-token contexts taking environment turns',
      longP99 === undefined ? 'not run' : `${f1(longP99)} ms`,
      '<= 5 ms',
      longP99 === undefined ? '-' : longP99 <= 5 ? 'met' : `not met (${f1(longP99 / 5)}x)`,
    ],
  ];
  const engineBoundRows = r.engineBound.map((pass) => engineBoundRow(pass, o.trajectories, figures, problems));
  if (r.nullSmall && r.bwrap) figures.sandboxSlowdown = Number(figures.nullSmallTrajectoriesPerS) / Number(figures.bwrapTrajectoriesPerS);

  const m = r.machine;
  const out = [
    `Orchestration benchmark: fake vLLM engine (test double) at zero token latency (after a service time in the engine-bound passes)`,
    `machine: ${String(m.cpus)} × ${String(m.cpuModel)}, ${f1(Number(m.totalMemoryBytes) / KIB ** 3)} GiB, node ${String(m.node)}, ${String(m.platform)}`,
    `machine speed now: a fixed reference workload (bench/calibration.ts) took ${referenceLine(m.referenceWorkMs)} ms of CPU at the start / after the throughput passes; CPU figures of two runs compare only next to it`,
    `processes: client (this one) | server child | engine child; null sandboxes + bench-calc (2 LLM turns per trajectory)`,
    '',
    table([
      ['throughput', 'items', 'conc', 'wall s', 'traj/s', 'turns/s', 'req/s', 'p50 ms', 'p99 ms', 'failed'],
      ['server (gRPC session -> pipeline -> engine)', `${s.trajectories} traj`, String(o.concurrency), f1(sec(s.wallMs)), f0(serverTrajPerS), f0(serverTurnsPerS), '-',
        f0(percentile(s.latenciesMs, 50)), f0(percentile(s.latenciesMs, 99)), String(notCompleted(s))],
      [`direct (VllmClient -> engine, same requests; median of ${d.passesWallMs.length})`, `${d.requests} req`, String(o.concurrency), f1(sec(d.wallMs)), '-', '-', f0(directReqPerS),
        f0(percentile(d.latenciesMs, 50)), f0(percentile(d.latenciesMs, 99)), String(d.errors)],
      ['ratio: server turns/s / direct req/s', '', '', '', '', '', f2(ratio), '', '', ''],
    ]),
    `where the server pass's latency goes: submit -> accepted p50 ${f0(percentile(s.acceptMs, 50))} ms (p99 ${f0(percentile(s.acceptMs, 99))}), ` +
      `accepted -> trajectory sent (server timing.totalMs) p50 ${f0(percentile(s.serverTotalMs, 50))} ms (p99 ${f0(percentile(s.serverTotalMs, 99))})`,
    `requests: mean ${f0(d.promptTokens / d.requests)} prompt tokens, ${f0(d.completionTokens / d.requests)} completion tokens; ` +
      `direct passes ${d.passesWallMs.map((ms) => f0(d.requests / sec(ms))).join(' / ')} req/s`,
    `server event loop during the pass: utilization ${f2(s.eventLoop.utilization)}, delay p50 ${f0(s.eventLoop.delayP50Ms)} ms, ` +
      `p99 ${f0(s.eventLoop.delayP99Ms)} ms, max ${f0(s.eventLoop.delayMaxMs)} ms`,
    `the client's ${o.concurrency} outstanding trajectories, on average over ${s.inFlight.samples} samples of the server's counters: ` +
      `${f0(s.inFlight.meanInbound)} not yet read by the server, ${f0(s.inFlight.meanTrajectories)} in its pipeline (max ${s.inFlight.maxTrajectories}; ` +
      `${f0(s.inFlight.meanEngineRequests)} engine requests open), ${f0(s.inFlight.meanOutbound)} finished but not yet received`,
    '',
    table([
      ['cpu time (µs)', 'server', 'engine', 'client', 'other processes (cores)'],
      ['server pass, per LLM turn', f0(s.cpu.server / s.turns), f0(s.cpu.engine / s.turns), f0(s.cpu.client / s.turns), cores(s.cpu)],
      ['direct pass, per request', '-', f0(d.cpu.engine / d.requests), f0(d.cpu.client / d.requests), cores(d.cpu)],
    ]),
    `the ratio as CPU accounting (every process CPU-bound on the same cores): (engine + client per direct request) / (server + engine + client ` +
      `per turn) = ${f2(ratioModel.model)} (measured ${f2(ratio)}); a server costing no CPU would reach ${f2(ratioModel.ceiling)}; 0.6 needs ` +
      (ratioModel.serverBudgetFor06 > 0 ? `<= ${f0(ratioModel.serverBudgetFor06)} µs of server CPU per turn at these engine and client costs` : 'more than a free server at these engine and client costs'),
    '',
    table([
      ['server memory (own process, after full GC)', 'count', 'heap', 'rss', 'external'],
      ['per in-flight trajectory (turn 2 pending)', String(h.held), kib(perHeld('heapUsed')), kib(perHeld('rss')),
        kib(Number(figures.offHeapBytesPerInFlightTrajectory))],
      [`retained per finished trajectory (task store, ${s.retained.tasks} tasks)`, String(s.retained.trajectories), kib(Number(figures.retainedHeapBytesPerFinishedTrajectory)), '', ''],
      [`kept per finished, unacked trajectory (its session; ${kib(Number(figures.countedBytesPerUnackedTrajectory))} counted by the bound)`, String(r.unacked.count),
        kib(Number(figures.heapBytesPerUnackedTrajectory)), '', kib(Number(figures.offHeapBytesPerUnackedTrajectory))],
    ]),
    `heap after the ${h.held} held trajectories were cancelled, vs before them: ${signedKib(h.after.heapUsed - h.base.heapUsed)} at once, ` +
      `${signedKib(h.settled.heapUsed - h.base.heapUsed)} ${f1(h.settleMs / 1000)} s later (idle engine connections closed)`,
  ];
  if (longRows.length > 0) {
    out.push(
      '',
      `long contexts: ${o.longTrajectories} trajectories of ${LONG_ENV}, ${o.longPages} environment turns each (pages of ${o.longPageChars} characters), ` +
        `prompts of ${o.longPromptChars} characters`,
      table([['server', 'traj', 'conc', 'wall s', 'context at env turns (tokens)', 'loop delay p50 ms', 'p99 ms', 'max ms', 'loop busy', 'server cpu/traj', 'others (cores)', 'statuses'], ...longRows]),
      'loop delay: how late a 10 ms timer ran on the server\'s event loop (0 = never blocked); it includes waiting for a core when other processes take them',
      '',
      table([['cpu ms per trajectory (long contexts)', 'server event loop', 'token threads', 'V8/libuv helpers', 'engine', 'client'], ...longCpuRows]),
    );
  }
  if (sandboxRows.length > 0) {
    out.push('', table([['sandboxes (same load)', 'traj', 'conc', 'wall s', 'traj/s', 'turns/s', 'p50 ms', 'p99 ms', 'statuses'], ...sandboxRows]));
    if (figures.sandboxSlowdown !== undefined) out.push(`real sandboxes: ${f1(Number(figures.sandboxSlowdown))}× fewer trajectories/s than null sandboxes`);
  }
  if (engineBoundRows.length > 0) {
    out.push(
      '',
      `engine-bound passes: the engine double answers each request a service time after it arrives (uniform over 0.5-1.5 × the mean, the same for a ` +
        `request in both passes; a timer: no CPU, as a GPU engine's decoding costs the host little), the same load as above, then its requests ` +
        `straight at the engine; ${o.concurrency} in flight`,
      table([['mean service time', 'server turns/s', 'direct req/s', 'ratio', 'server cores', 'server cpu/turn', 'traj p50 ms', 'direct req p50 ms', 'others (cores)', 'failed'], ...engineBoundRows]),
      'the ratio here says whether the server keeps an engine that is the bottleneck as busy as a direct client does (1.00: as busy); it falls ' +
        'once turns/s × server CPU per turn nears the cores the server shares with the client and the engine double (2 in all); ' +
        'traj p50 against 2 × direct req p50 is about the latency the server adds per 2-turn trajectory',
    );
  }
  const load = `other processes took ${cores(s.cpu)} cores during the server pass (2 cores in all: wall-clock figures and the ratio suffer when it is not near 0; CPU per turn much less)`;
  out.push('', table(targets), load);
  out.push('', problems.length === 0 ? 'status: every trajectory and request succeeded; no leaked sandboxes, leases or samples' : `status: ${problems.length} problem(s), see stderr`);
  return { table: out.join('\n'), figures, problems };
}

/**
 * What went wrong in a server pass and the direct replay of its requests: trajectories missing, not COMPLETED or
 * rejected, an engine request count other than one per turn, failed direct requests. Empty when nothing did.
 */
function passProblems(serverName: string, directName: string, s: DriveResult, d: ReplayResult, trajectories: number): string[] {
  const out: string[] = [];
  if (s.trajectories !== trajectories) out.push(`${serverName} delivered ${s.trajectories}/${trajectories} trajectories`);
  if (notCompleted(s) > 0) out.push(`${serverName}: ${notCompleted(s)} trajectories not COMPLETED (${statusList(s.statuses)}), e.g. ${s.errors[0] ?? '?'}`);
  if (s.rejected.length > 0) out.push(`${serverName}: ${s.rejected.length} tasks rejected, e.g. ${s.rejected[0]}`);
  if (d.requests !== s.turns) out.push(`${serverName}: engine recorded ${d.requests} requests for ${s.turns} turns`);
  if (d.errors > 0) out.push(`${directName}: ${d.errors} failed requests, e.g. ${d.firstError}`);
  return out;
}

/** One engine-bound pass as a table row; its figures and problems are added to the run's. */
function engineBoundRow(pass: EngineBoundPass, trajectories: number, figures: Figures, problems: string[]): string[] {
  const { server: s, direct: d, serviceMs, servers } = pass;
  const name = `engine-bound pass (${serviceMs} ms${servers > 1 ? `, ${servers} servers` : ''})`;
  problems.push(...passProblems(name, `${name}, direct`, s, d, trajectories));
  const turnsPerS = s.turns / (s.wallMs / 1000);
  const reqPerS = d.requests / (d.wallMs / 1000);
  const serverCores = pass.serverCpu.server / pass.serverCpu.wallMicros;
  const key = `engineBound${serviceMs}ms${servers > 1 ? `${servers}Servers` : ''}`;
  figures[`${key}ServerTurnsPerS`] = turnsPerS;
  figures[`${key}DirectRequestsPerS`] = reqPerS;
  figures[`${key}Ratio`] = turnsPerS / reqPerS;
  figures[`${key}ServerCores`] = serverCores;
  figures[`${key}ServerCpuMicrosPerTurn`] = pass.serverCpu.server / s.turns;
  figures[`${key}TrajectoryLatencyP50Ms`] = percentile(s.latenciesMs, 50);
  figures[`${key}DirectLatencyP50Ms`] = percentile(d.latenciesMs, 50);
  return [
    servers > 1 ? `${serviceMs} ms, ${servers} servers` : `${serviceMs} ms`,
    f0(turnsPerS),
    f0(reqPerS),
    f2(turnsPerS / reqPerS),
    f2(serverCores),
    `${f0(pass.serverCpu.server / s.turns)} µs`,
    f0(percentile(s.latenciesMs, 50)),
    f0(percentile(d.latenciesMs, 50)),
    cores(pass.serverCpu),
    String(notCompleted(s) + d.errors),
  ];
}

/**
 * The orchestration ratio predicted from CPU time alone: with the server, the engine double and the client all
 * CPU-bound on the same cores, throughput is inversely proportional to the CPU one item costs all of them. So the
 * ratio is about (engine + client per direct request) / (server + engine + client per turn); the ceiling is that
 * with a server that costs nothing, and the budget is the server CPU per turn at which it reaches 0.6. It shows how
 * much of the ratio the server can move at all when the engine double is cheap.
 */
function cpuBoundRatio(s: BenchResults['server'], d: BenchResults['direct']): { model: number; ceiling: number; serverBudgetFor06: number } {
  const direct = (d.cpu.engine + d.cpu.client) / d.requests;
  const others = (s.cpu.engine + s.cpu.client) / s.turns;
  const server = s.cpu.server / s.turns;
  return { model: direct / (server + others), ceiling: direct / others, serverBudgetFor06: direct / 0.6 - others };
}

/** "150.4 / 152.0" from the machine's reference times, "-" when the results predate them. */
function referenceLine(value: unknown): string {
  const r = value as { atStart?: number; afterPasses?: number } | undefined;
  return r?.atStart === undefined || r.afterPasses === undefined ? '-' : `${f1(r.atStart)} / ${f1(r.afterPasses)}`;
}
