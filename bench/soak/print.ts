import type { SoakResult } from './run.js';

const MIB = 1024 * 1024;
const f0 = (x: number | undefined): string => (x === undefined || Number.isNaN(x) ? '-' : x.toFixed(0));
const f1 = (x: number | undefined): string => (x === undefined || Number.isNaN(x) ? '-' : x.toFixed(1));
const f2 = (x: number | undefined): string => (x === undefined || Number.isNaN(x) ? '-' : x.toFixed(2));

/** The soak's figures as text: the memory table, then throughput, latency, memory, accounting and leftovers. */
export function renderSoak(r: SoakResult): { text: string } {
  const o = r.options;
  const c = r.counts;
  const lines: string[] = [];
  lines.push(`# soak: ${o.minutes} min, ${o.concurrency} samples in flight over ${o.sessions} sessions, group size ${o.groupSize}`);
  lines.push(`mix: every ${o.sandboxEvery}th task math (python tool in bubblewrap), the rest soak-calc (in-process calc tool, null sandbox)`);
  lines.push(`kill -9: ${o.killAt === undefined ? 'none' : `at ${(o.killAt * 100).toFixed(0)}% of the load phase`}; journal: ${o.journalDir ?? 'none'}`);
  lines.push(`server pids ${r.serverPids.join(' → ')}; work dir ${r.workDir}`);
  lines.push('');
  lines.push('## server memory over time');
  lines.push('| t (s) | phase | pid | RSS (MiB) | fds | threads | in flight | received |');
  lines.push('| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |');
  // At most ~40 rows: every k-th sample, plus the first and last of each phase.
  const step = Math.max(1, Math.ceil(r.samples.length / 40));
  r.samples.forEach((s, i) => {
    const edge = i === 0 || i === r.samples.length - 1 || r.samples[i - 1]?.phase !== s.phase || r.samples[i + 1]?.phase !== s.phase;
    if (!edge && i % step !== 0) return;
    lines.push(`| ${f0(s.t)} | ${s.phase} | ${s.pid} | ${f0(s.rss / MIB)} | ${s.fds} | ${s.threads} | ${s.inflight} | ${s.received} |`);
  });
  lines.push('');
  lines.push('## figures');
  lines.push(`load phase ${f0(r.loadSeconds)} s: ${f1(r.tasksPerSecond)} tasks/s, ${f1(r.trajectoriesPerSecond)} trajectories/s`);
  lines.push(`latency submit → trajectory (tasks not spanning the kill, n=${r.latencyMs.count}): p50 ${f0(r.latencyMs.p50)} ms, p90 ${f0(r.latencyMs.p90)} ms, p99 ${f0(r.latencyMs.p99)} ms`);
  lines.push(`of which submit → accepted (the server reading, validating, admitting; n=${r.acceptMs.count}): p50 ${f0(r.acceptMs.p50)} ms, p90 ${f0(r.acceptMs.p90)} ms, p99 ${f0(r.acceptMs.p99)} ms`);
  lines.push(`of which server finished → client received (accepted → received − the server's timing.totalMs): p50 ${f0(r.deliveryMs.p50)} ms, p90 ${f0(r.deliveryMs.p90)} ms, p99 ${f0(r.deliveryMs.p99)} ms`);
  lines.push(`server RSS: min ${f0(r.rss.minMiB)} MiB, max ${f0(r.rss.maxMiB)} MiB; slope over the steady phase before the kill ${f2(r.rssSlopeMiBPerMin.before)} MiB/min, after the restart ${f2(r.rssSlopeMiBPerMin.after)} MiB/min`);
  lines.push(`server RSS troughs (lowest in each third of the steady phase; what a leak raises): before the kill ${r.rssTroughsMiB.before.map(f0).join(' → ')} MiB` +
    (r.rssTroughsMiB.after.length > 0 ? `, after the restart ${r.rssTroughsMiB.after.map(f0).join(' → ')} MiB` : ''));
  lines.push(`server live V8 heap after a full GC (lowest in each third): before the kill ${r.heapTroughsMiB.before.map(f0).join(' → ')} MiB` +
    (r.heapTroughsMiB.after.length > 0 ? `, after the restart ${r.heapTroughsMiB.after.map(f0).join(' → ')} MiB` : ''));
  lines.push(`server CPU before the kill: ${f2(r.cpu.serverMsPerTrajectory)} ms per trajectory, ${f2(r.cpu.serverCores)} cores; the rest of the machine (client, engine, other work): ${f2(r.cpu.otherCores)} cores`);
  lines.push(`client (this process) over the load phase: ${f2(r.client.cores)} cores; event loop late p50 ${f0(r.client.loopDelayP50Ms)} ms, p99 ${f0(r.client.loopDelayP99Ms)} ms, max ${f0(r.client.loopDelayMaxMs)} ms`);
  const m = c.meanTimingMs;
  lines.push(`server timing per trajectory (means): queue ${f1(m.queue)} ms, init ${f1(m.init)} ms, llm ${f1(m.llm)} ms, tool ${f1(m.tool)} ms, eval ${f1(m.eval)} ms, total ${f1(m.total)} ms`);
  if (r.restartMs !== undefined) lines.push(`restart: kill -9 → listening again in ${f0(r.restartMs)} ms`);
  lines.push(`final stop: SIGTERM → exit in ${f0(r.finalStop.exitMs)} ms (code ${r.finalStop.code}, signal ${r.finalStop.signal}${r.finalStop.forced ? ', KILLED after the grace' : ''})`);
  lines.push(`engine: ${r.engine.received} requests, ${r.engine.served} served, ${r.engine.failed} failed, ${r.engine.disconnected} dropped by the server`);
  lines.push('');
  lines.push('## accounting');
  lines.push(`tasks submitted ${c.tasksSubmitted}: ${Object.entries(c.byState).map(([k, v]) => `${k} ${v}`).join(', ')}`);
  lines.push(`samples expected ${c.samplesExpected}, trajectories received ${c.trajectoriesReceived}: ${Object.entries(c.statuses).map(([k, v]) => `${k} ${v}`).join(', ')}`);
  lines.push(`by environment: ${Object.entries(c.byEnvironment).map(([k, v]) => `${k} ${v}`).join(', ')}`);
  if (o.killAt !== undefined) {
    lines.push(`accepted and unfinished at the kill: ${c.acceptedInFlightAtKill}; lost (server: NOT_FOUND after the restart): ${c.byState.lost}`);
    lines.push(`re-sent after the restart (never told accepted): ${c.resubmitted}, of which the server already had ${c.resubmitDuplicates}`);
    const resumed = r.reconnects.filter((x) => x.resumed);
    lines.push(`sessions resumed ${resumed.length}/${r.reconnects.length} (redelivered ${resumed.reduce((a, x) => a + x.redelivered, 0)}, pending ${resumed.reduce((a, x) => a + x.pending, 0)})` +
      (r.reconnects.some((x) => x.refused) ? `; refused: ${r.reconnects.find((x) => x.refused)?.refused}` : ''));
  }
  lines.push(`delivered again after an ack the server had provably read: ${c.duplicatesAfterAck}; again after an ack not yet read at the kill: ${c.redeliveredAckUnread}; again with the ack in flight (no kill): ${c.redeliveredAckInFlight}; unknown: ${c.unknownTrajectories}; malformed: ${c.malformedTrajectories}`);
  if (Object.keys(c.rejectReasons).length > 0) lines.push(`rejected: ${JSON.stringify(c.rejectReasons)}`);
  if (c.errorsOfFailedTrajectories.length > 0) lines.push(`failed trajectories, e.g.: ${c.errorsOfFailedTrajectories.join(' | ')}`);
  lines.push('');
  lines.push('## leftovers');
  if (r.afterRestartReap) {
    const a = r.afterRestartReap;
    lines.push(`of the killed server once the restarted one started (it reaps first): cgroups ${a.cgroups.length}, processes in them ${a.cgroupProcesses.length}, tagged processes ${a.taggedProcesses.length}, mounts ${a.mounts.length}`);
  }
  const l = r.leftovers;
  lines.push(`after the final stop: cgroups ${l.cgroups.length}, processes in them ${l.cgroupProcesses.length}, tagged sandbox processes ${l.taggedProcesses.length}, mounts ${l.mounts.length}, bench children ${l.children.length}`);
  lines.push('');
  lines.push(r.problems.length === 0 ? 'RESULT: accounting clean' : `RESULT: ${r.problems.length} problem(s):\n${r.problems.map((p) => `- ${p}`).join('\n')}\nthe server's log and config are kept in ${r.workDir}`);
  return { text: `${lines.join('\n')}\n` };
}
