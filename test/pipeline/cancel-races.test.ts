import { getEventListeners } from 'node:events';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../src/tokens/types.js';
import { TrajectoryReader } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';
import { probeTask, startProbe, type ProbeHarness } from '../support/probe-environment.js';

const S = TrajectoryStatus;
let tokenizer: Tokenizer;
let h: ProbeHarness;
let hungRequests = 0;
beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
  h = await startProbe({
    config: { init: { concurrency: 4 }, eval: { concurrency: 4 } },
    engine: {
      // A request whose prompt says llm-hang is answered only when the client goes away.
      inject: ({ body }) => {
        if (!tokenizer.decode(body.prompt as number[]).includes('llm-hang')) return undefined;
        hungRequests++;
        return { kind: 'hang' };
      },
    },
  });
});
afterAll(async () => h?.close());

const key = (t: Trajectory): string => `${t.taskId}#${t.sampleIndex}`;

describe('cancel races through the real stream', () => {
  it('cancels in every stage, half-done groups and finished tasks: each sample delivered exactly once, with the right status; nothing left held', async () => {
    const runtime = h.server.runtime;
    const listenersBefore = getEventListeners(runtime.lifecycle.admission, 'abort').length + getEventListeners(runtime.lifecycle.signal, 'abort').length;
    const session = h.client.openSession();
    const reader = new TrajectoryReader(session);
    const expected = new Map<string, string>();

    // Finished first, then cancelled (a no-op that must not deliver it again).
    await session.submit(probeTask('done-then-cancel', {}));
    await reader.take(1);
    expected.set('done-then-cancel#0', 'COMPLETED');
    session.cancel('done-then-cancel');

    // In eval, run (tool), run (LLM request in flight), init.
    await session.submit(probeTask('c-eval', { eval: 'gate:never-eval' }));
    await session.submit(probeTask('c-tool', { run: 'tool:never-tool' }));
    await session.submit(probeTask('c-llm-hang', {}));
    await eventually(() => h.state.count('c-eval', 'eval', 'enter') === 1 && h.state.count('never-tool', 'tool', 'enter') === 1, 'eval and tool reached');
    await eventually(() => hungRequests === 1, 'llm request in flight');
    // A group of four: even samples finish, odd ones wait at a gate; cancel the group half done.
    await session.submit(probeTask('c-half', { run: 'odd:never-half' }, { numSamples: 4, sampling: { seed: 7, maxTokensPerTurn: 64, maxTotalTokens: 2048, stop: [] } }));
    const halfDone = await reader.take(2);
    expect(halfDone.map(key).sort()).toEqual(['c-half#0', 'c-half#2']);
    // Fill init's four slots, then one more waits for a slot (queued).
    for (let i = 0; i < 4; i++) await session.submit(probeTask(`c-init-${i}`, { init: 'gate:never-init' }));
    await session.submit(probeTask('c-queued', {}));
    await eventually(() => runtime.pipeline.stageStats().find((s) => s.stage === 'init')!.queued === 1, 'one queued for init');

    // The queued one first: a cancel of an init task frees its slot, and the queued task, which waits at no gate, could
    // then run to the end before a cancel sent after it is read (the stream reads one request at a time).
    for (const id of ['c-queued', 'c-eval', 'c-tool', 'c-llm-hang', 'c-init-0', 'c-init-1', 'c-init-2', 'c-init-3', 'c-half']) session.cancel(id);
    for (const id of ['c-eval', 'c-tool', 'c-llm-hang', 'c-init-0', 'c-init-1', 'c-init-2', 'c-init-3', 'c-queued']) expected.set(`${id}#0`, 'CANCELLED');
    expected.set('c-half#0', 'COMPLETED');
    expected.set('c-half#2', 'COMPLETED');
    expected.set('c-half#1', 'CANCELLED');
    expected.set('c-half#3', 'CANCELLED');
    session.close();
    await reader.rest();

    const seen = reader.received.map(key);
    expect(seen.length, `deliveries: ${seen.join(' ')}`).toBe(new Set(seen).size);
    expect(Object.fromEntries(reader.received.map((t) => [key(t), S[t.status].replace('TRAJECTORY_STATUS_', '')]))).toEqual(Object.fromEntries(expected));

    await eventually(() => runtime.pipeline.inFlight === 0 && h.driver.live === 0, 'nothing in flight, every sandbox stopped');
    expect(runtime.admission.inFlight).toBe(0);
    expect(runtime.pipeline.stageStats().map((s) => [s.stage, s.active, s.queued])).toEqual([['init', 0, 0], ['run', 0, 0], ['eval', 0, 0]]);
    const pool = h.server.pool.stats();
    expect({ trajectories: pool.inflightTrajectories, requests: pool.inflightRequests, leases: pool.leases, waiting: pool.waitingAcquires }).toEqual({ trajectories: 0, requests: 0, leases: 0, waiting: 0 });
    expect(h.state.signals.every((s) => s.aborted)).toBe(true);
    const listenersAfter = getEventListeners(runtime.lifecycle.admission, 'abort').length + getEventListeners(runtime.lifecycle.signal, 'abort').length;
    expect(listenersAfter).toBeLessThanOrEqual(listenersBefore);
  });
});
