import { afterEach, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { parseConfig } from '../../src/config.js';
import { RolloutError } from '../../src/errors.js';
import { hermesToolCall, type FakePolicy } from '../../src/testing/scripted-policy.js';
import { collect, mathTask, startHarness, type Harness } from '../support/harness.js';

describe('maxToolCallsPerMessage (server config)', () => {
  let h: Harness | undefined;
  afterEach(async () => {
    await h?.close();
    h = undefined;
  });

  it('defaults to 16 and refuses what is not a whole number from 1 to 1024, naming the field', () => {
    expect(parseConfig({}).maxToolCallsPerMessage).toBe(16);
    expect(parseConfig({ maxToolCallsPerMessage: 64 }).maxToolCallsPerMessage).toBe(64);
    for (const bad of [0, -1, 1.5, 1025, '16']) {
      let err: unknown;
      try {
        parseConfig({ maxToolCallsPerMessage: bad });
      } catch (e) {
        err = e;
      }
      expect(err, String(bad)).toBeInstanceOf(RolloutError);
      expect((err as RolloutError).field).toBe('maxToolCallsPerMessage');
    }
  });

  it('runs that many calls of one assistant message and answers the rest with one observation', async () => {
    // Three calls in one message, two allowed: the third is not run and the model is told so.
    const threeCalls: FakePolicy = () => [1, 2, 3].map((n) => hermesToolCall('python', { code: `print(${n})` })).join('\n');
    h = await startHarness({ maxToolCallsPerMessage: 2 }, { policy: threeCalls });
    const session = h.client.openSession();
    await session.submit(mathTask('calls-per-message', 1, 1, { includeMessages: true, limits: { maxTurns: 2, initTimeoutMs: 0, runTimeoutMs: 0, evalTimeoutMs: 0, totalTimeoutMs: 0 } }));
    session.close();
    const [t] = await collect(session.trajectories());
    expect(t!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED);
    expect(t!.messages.filter((m) => m.role === 'tool').map((m) => m.content.trim())).toEqual([
      '1',
      '2',
      'Error: 1 more tool calls in this message were not run (at most 2 per message); call them again in your next message if you still need them.',
    ]);
  });
});
