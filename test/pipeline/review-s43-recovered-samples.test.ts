import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { limits } from '../support/server-harness.js';
import { probeTask, startProbe, type ProbeHarness } from '../support/probe-environment.js';
import { eventually } from '../support/wait.js';

// From the session-43 pipeline review. A journaled server that restarts runs again what was unfinished; the recovered
// samples go through admission one task after another (FIFO, like new tasks). Their total timeout started when they
// were made — at start-up, before that wait — so a backlog longer than a task's total_timeout_ms failed it TIMEOUT
// without it ever running: the server's own queue reported as the task's timeout. A new task's samples are made once
// admitted; a recovered one's clock now also starts when it enters the pipeline.
//
// A recovered sample cancelled while it waited for admission entered the pipeline already cancelled and then waited
// for a stage permit like any other — with every permit held (slow episodes, a long pause) its CANCELLED came only when
// one freed up, its admission held meanwhile. It is now finished as it enters.

const harnesses: ProbeHarness[] = [];
const dirs: string[] = [];
afterEach(async () => {
  for (const h of harnesses.splice(0)) await h.close();
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

async function journaled(dir: string, maxAdmitted: number, concurrency = { init: 8, run: 8, eval: 8 }): Promise<ProbeHarness> {
  const h = await startProbe({
    config: { journal: { dir }, maxAdmitted, init: { concurrency: concurrency.init }, run: { concurrency: concurrency.run }, eval: { concurrency: concurrency.eval } },
  });
  harnesses.push(h);
  return h;
}

describe('samples recovered from the journal behind a backlog', () => {
  it('get their whole total timeout once admitted, not what the wait for admission left of it', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollout-s43-recovered-'));
    dirs.push(dir);
    const a = await journaled(dir, 100);
    // Both wait in init at a gate when the server stops: both are run again at the next start.
    await a.client.submit(probeTask('first', { init: 'gate:s43-hold' }, { limits: limits({ totalTimeoutMs: 60_000 }) }));
    await a.client.submit(probeTask('second', { init: 'gate:s43-hold' }, { limits: limits({ totalTimeoutMs: 3_000 }) }));
    await eventually(() => a.state.count('second', 'init', 'enter') === 1, 'both in init');
    await a.close();

    // One sample admitted at a time: "first" runs (and waits at the gate), "second" waits for admission behind it.
    const b = await journaled(dir, 1);
    await eventually(() => b.state.count('first', 'init', 'enter') === 1, 'the first recovered sample in init', 30_000);
    // Longer than second's whole total timeout.
    await sleep(4_000);
    expect(b.state.count('second', 'init', 'enter')).toBe(0);
    b.state.open('s43-hold');
    const first = (await b.client.getTrajectory('first', { wait: true, deadlineMs: 60_000 })).trajectories[0]!;
    const second = (await b.client.getTrajectory('second', { wait: true, deadlineMs: 60_000 })).trajectories[0]!;
    expect(TrajectoryStatus[first.status]).toBe('TRAJECTORY_STATUS_COMPLETED');
    expect(`${TrajectoryStatus[second.status]} ${second.error}`).toBe('TRAJECTORY_STATUS_COMPLETED ');
    expect(b.state.count('second', 'init', 'enter')).toBe(1);
    // Its total time counts from its entry into the pipeline, not from the server's start.
    expect(second.timing!.totalMs).toBeLessThan(3_000);
    expect(b.driver.live).toBe(0);
  }, 120_000);
});

describe('a recovered sample cancelled while it waits for admission', () => {
  it('is delivered CANCELLED as soon as it is admitted, without waiting for a stage permit', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollout-s43-recovered-cancel-'));
    dirs.push(dir);
    const a = await journaled(dir, 100);
    const ids = ['hold-0', 'hold-1', 'hold-2', 'queued', 'late'];
    for (const id of ids) await a.client.submit(probeTask(id, { init: 'gate:s43-hold' }));
    await eventually(() => ids.every((id) => a.state.count(id, 'init', 'enter') === 1), 'all five in init');
    await a.close();

    // Three stage permits (one per stage), four samples admitted: the holders take the permits (hold-0 in init at the
    // gate, the other two queued for init with theirs), "queued" waits for a permit, "late" for admission.
    const b = await journaled(dir, 4, { init: 1, run: 1, eval: 1 });
    await eventually(() => b.state.count('hold-0', 'init', 'enter') === 1, 'the first holder in init', 30_000);
    await eventually(() => b.server.runtime.admission.inFlight === 4 && b.server.runtime.admission.waiting === 1, 'four admitted, one waiting');
    expect((await b.client.cancel('late')).cancelled).toBe(1);
    // Cancelling "queued" gives its admission to "late", already cancelled: it must not wait for a permit now.
    expect((await b.client.cancel('queued')).cancelled).toBe(1);
    const late = await b.client.getTrajectory('late', { wait: true, deadlineMs: 10_000 });
    expect(late.trajectories.map((t) => TrajectoryStatus[t.status])).toEqual(['TRAJECTORY_STATUS_CANCELLED']);
    expect(b.state.count('late', 'init', 'enter')).toBe(0);
    expect(b.state.count('hold-0', 'init', 'leave')).toBe(0);

    b.state.open('s43-hold');
    for (const id of ['hold-0', 'hold-1', 'hold-2']) {
      const t = (await b.client.getTrajectory(id, { wait: true, deadlineMs: 60_000 })).trajectories[0]!;
      expect(TrajectoryStatus[t.status]).toBe('TRAJECTORY_STATUS_COMPLETED');
    }
    await eventually(() => b.server.runtime.pipeline.inFlight === 0 && b.driver.live === 0, 'nothing left in flight');
    expect(b.server.runtime.admission.inFlight).toBe(0);
  }, 120_000);
});
