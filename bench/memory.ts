import type { RolloutClient } from '../src/client/rollout-client.js';
import { CALC_ENVIRONMENT } from '../src/testing/calc-environment.js';
import type { ChildHandle } from './child-rpc.js';
import { benchTask, statusName } from './drive.js';
import type { EngineApi, EngineInfo } from './engine-child.js';
import { startProgress } from './progress.js';
import type { ServerApi, ServerInfo, ServerStats } from './server-child.js';

export interface HoldResult {
  held: number;
  /** Server process memory after full GCs: before the load, with `held` trajectories in flight, after they ended. */
  base: NodeJS.MemoryUsage;
  during: NodeJS.MemoryUsage;
  after: NodeJS.MemoryUsage;
  serverBase: ServerStats;
  serverDuring: ServerStats;
  serverAfter: ServerStats;
  /** Statuses of the held trajectories once cancelled (all CANCELLED when cleanup works). */
  statuses: Record<string, number>;
  /** Server process memory `settleMs` later, once engine connections left idle by the burst have closed. */
  settled: NodeJS.MemoryUsage;
  serverSettled: ServerStats;
  settleMs: number;
  fillMs: number;
  cancelMs: number;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * With BENCH_HEAP_SNAPSHOT=<dir>, heap snapshots of the server are written there before the load, while it is
 * held and after it ended (to see what an in-flight trajectory is made of); the RSS figures are then not trustworthy.
 *
 * Holds `count` trajectories in flight on the server and measures its memory: the engine leaves every second-turn
 * request unanswered (`hold`), so each trajectory sits mid-episode — sandbox, ledger with one assistant turn and
 * one tool observation, backend lease, an open HTTP request to the engine — until the client cancels them all.
 */
export async function holdInFlight(
  client: RolloutClient,
  engine: ChildHandle<EngineApi, EngineInfo>,
  server: ChildHandle<ServerApi, ServerInfo>,
  count: number,
  timeoutMs: number,
  settleMs = 6_000,
): Promise<HoldResult> {
  const base = await server.call('memory');
  const serverBase = await server.call('stats');
  const snapshotDir = process.env.BENCH_HEAP_SNAPSHOT;
  if (snapshotDir) process.stderr.write(`heap snapshot before: ${await server.call('heapSnapshot', snapshotDir)}\n`);
  await engine.call('hold', true);
  const session = client.openSession({ sessionId: 'memory-hold-session' });
  await session.opened;
  const taskIds = Array.from({ length: count }, (_, i) => `hold-${i}`);
  const started = performance.now();
  const deadline = started + timeoutMs;
  const fill = startProgress(`memory: hold ${count} in flight`, count);
  try {
    await Promise.all(taskIds.map((taskId, i) => session.submit(benchTask(taskId, CALC_ENVIRONMENT, 1, 900_000 + i))));
    for (;;) {
      const stats = await engine.call('stats');
      fill.update(stats.held);
      if (stats.held >= count) break;
      if (performance.now() > deadline) throw new Error(`memory phase: only ${stats.held}/${count} trajectories reached the held turn`);
      await sleep(50);
    }
  } finally {
    fill.stop();
  }
  const fillMs = performance.now() - started;
  const serverDuring = await server.call('stats');
  const during = await server.call('memory');
  // Taken after `during` is measured: writing a snapshot grows the process's RSS for good.
  if (snapshotDir) process.stderr.write(`heap snapshot with ${count} in flight: ${await server.call('heapSnapshot', snapshotDir)}\n`);

  const cancelStarted = performance.now();
  for (const taskId of taskIds) session.cancel(taskId);
  session.close();
  const statuses: Record<string, number> = {};
  const watchdog = setTimeout(() => session.abort(), timeoutMs);
  try {
    for await (const t of session.trajectories()) {
      const s = statusName(t.status);
      statuses[s] = (statuses[s] ?? 0) + 1;
    }
  } finally {
    clearTimeout(watchdog);
  }
  const cancelMs = performance.now() - cancelStarted;
  await engine.call('hold', false);
  const after = await server.call('memory');
  const serverAfter = await server.call('stats');
  // undici keeps idle keep-alive connections for ~4 s (the engine's server for 5 s); the heap is measured again once
  // they are gone, so what is left then is a leak, not a connection pool.
  await sleep(settleMs);
  const serverSettled = await server.call('stats');
  const settled = await server.call('memory');
  if (snapshotDir) process.stderr.write(`heap snapshot after the held trajectories ended: ${await server.call('heapSnapshot', snapshotDir)}\n`);
  return { held: count, base, during, after, serverBase, serverDuring, serverAfter, settled, serverSettled, settleMs, statuses, fillMs, cancelMs };
}

export interface UnackedResult {
  count: number;
  /** Server process memory after full GCs: every trajectory finished and received, none acked; then all acked. */
  unacked: NodeJS.MemoryUsage;
  acked: NodeJS.MemoryUsage;
  /** Bytes the session counted against its bound (sessions.stats) while nothing was acked. */
  unackedBytes: number;
}

/**
 * What a session keeps of a finished trajectory its client has not acked (a trainer that acks once per training
 * step leaves a whole step unacked). On a server that retains no finished task, so what the session holds is all
 * that holds it: `count` trajectories are run and received without acking, memory is measured, then all are acked and
 * it is measured again; the difference per trajectory is the session's.
 */
export async function holdUnacked(client: RolloutClient, server: ChildHandle<ServerApi, ServerInfo>, count: number, timeoutMs: number): Promise<UnackedResult> {
  const session = client.openSession({ sessionId: 'memory-unacked-session', autoAck: false });
  await session.opened;
  const refs: { taskId: string; sampleIndex: number }[] = [];
  const progress = startProgress(`memory: ${count} finished, not acked`, count);
  const watchdog = setTimeout(() => session.abort(), timeoutMs);
  try {
    await Promise.all(Array.from({ length: count }, (_, i) => session.submit(benchTask(`unacked-${i}`, CALC_ENVIRONMENT, 1, 950_000 + i))));
    for await (const t of session.trajectories()) {
      if (statusName(t.status) !== 'COMPLETED') throw new Error(`memory phase: unacked trajectory ${t.taskId} ended ${statusName(t.status)}`);
      refs.push({ taskId: t.taskId, sampleIndex: t.sampleIndex });
      progress.update(refs.length);
      if (refs.length === count) break;
    }
  } finally {
    clearTimeout(watchdog);
    progress.stop();
  }
  if (refs.length !== count) throw new Error(`memory phase: received ${refs.length}/${count} unacked trajectories`);
  const unackedBytes = (await server.call('stats')).sessions.unackedBytes;
  const unacked = await server.call('memory');
  // Leaving the loop cancelled the stream; the session stays resumable. Resume it and ack everything.
  const resumed = client.openSession({ sessionId: 'memory-unacked-session', resume: true, autoAck: false });
  await resumed.opened;
  resumed.ack(refs);
  resumed.close();
  const drain = setTimeout(() => resumed.abort(), timeoutMs);
  try {
    for await (const _ of resumed.trajectories()) {
      // the re-sent copies of what was unacked: acked above already
    }
  } finally {
    clearTimeout(drain);
  }
  const acked = await server.call('memory');
  return { count, unacked, acked, unackedBytes };
}
