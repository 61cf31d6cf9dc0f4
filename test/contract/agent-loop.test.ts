import { afterEach, describe, expect, it } from 'vitest';
import { Role, ToolOutcome, TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { hermesToolCall, type FakePolicy } from '../../src/testing/scripted-policy.js';
import { evaluateArithmetic } from '../../src/testing/arithmetic.js';
import { collect, invariantViolations, mathTask, startHarness, type Harness } from '../support/harness.js';

const limits = (maxTurns: number) => ({ maxTurns, initTimeoutMs: 0, runTimeoutMs: 0, evalTimeoutMs: 0, totalTimeoutMs: 0 });

async function runOne(h: Harness, taskId: string, extra: Parameters<typeof mathTask>[3] = {}): Promise<Trajectory> {
  const session = h.client.openSession();
  await session.submit(mathTask(taskId, 1, 1, { includeMessages: true, ...extra }));
  session.close();
  const [t] = await collect(session.trajectories());
  expect(invariantViolations(t!)).toEqual([]);
  return t!;
}

describe('the agent loop (run stage) end to end', () => {
  let h: Harness | undefined;
  afterEach(async () => {
    await h?.close();
    h = undefined;
  });

  it('stops at max_turns with TRUNCATED, the reward still computed, each tool turn recorded', async () => {
    const alwaysTool: FakePolicy = () => hermesToolCall('python', { code: 'print(6 * 7)' });
    h = await startHarness({}, { policy: alwaysTool });
    const t = await runOne(h, 'loop-max-turns', { limits: limits(3) });
    expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED);
    expect(t.finishReason).toBe('max_turns');
    expect(t.numTurns).toBe(3);
    expect(t.turns.map((x) => x.role)).toEqual([Role.ROLE_ASSISTANT, Role.ROLE_TOOL, Role.ROLE_ASSISTANT, Role.ROLE_TOOL, Role.ROLE_ASSISTANT]);
    const toolTurns = t.turns.filter((x) => x.role === Role.ROLE_TOOL);
    expect(toolTurns.every((x) => x.toolName === 'python' && x.toolOutcome === ToolOutcome.TOOL_OUTCOME_OK)).toBe(true);
    expect(t.messages.filter((m) => m.role === 'tool').map((m) => m.content.trim())).toEqual(['42', '42']);
    expect(t.rewardDetails.has_answer).toBe(0);
  });

  it('stops at max_total_tokens with TRUNCATED and never exceeds the budget', async () => {
    const rambling: FakePolicy = () => 'word '.repeat(400);
    h = await startHarness({}, { policy: rambling });
    const t = await runOne(h, 'loop-budget', { sampling: { maxTokensPerTurn: 200, maxTotalTokens: 600, stop: [] } });
    expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED);
    expect(['max_total_tokens', 'max_tokens_per_turn']).toContain(t.finishReason);
    expect(t.promptTokenIds.length + t.responseTokenIds.length).toBeLessThanOrEqual(600);
  });

  it('ends on the finish tool with COMPLETED and grades its answer', async () => {
    const finisher: FakePolicy = (prompt) => {
      const m = /What is ([0-9+\-*() ]+)\?/.exec(prompt);
      const value = String(evaluateArithmetic(m![1]!));
      return hermesToolCall('finish', { answer: value });
    };
    h = await startHarness({}, { policy: finisher });
    const t = await runOne(h, 'loop-finish');
    expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
    expect(t.finishReason).toBe('finish_tool');
    expect(t.reward).toBe(1);
    expect(t.numTurns).toBe(1);
  });

  it('turns a malformed tool call into an error observation and lets the model continue', async () => {
    let calls = 0;
    const clumsy: FakePolicy = () => (++calls === 1 ? '<tool_call>\n{"name": "python", "arguments": {"code": \n</tool_call>' : 'I give up. \\boxed{0}');
    h = await startHarness({}, { policy: clumsy });
    const t = await runOne(h, 'loop-malformed');
    expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
    expect(t.numTurns).toBe(2);
    const tool = t.turns.find((x) => x.role === Role.ROLE_TOOL);
    expect(tool?.toolOutcome).toBe(ToolOutcome.TOOL_OUTCOME_MALFORMED);
    expect(t.messages.find((m) => m.role === 'tool')?.content.toLowerCase()).toContain('json');
  });

  it('a run that fails mid-way is BACKEND_ERROR, keeps the tokens it got to, and is never scored', async () => {
    const alwaysTool: FakePolicy = () => hermesToolCall('python', { code: 'print(1)' });
    h = await startHarness({}, { policy: alwaysTool, inject: ({ index }) => (index >= 1 ? { kind: 'status', status: 500 } : undefined) });
    const t = await runOne(h, 'loop-partial', { limits: limits(4) });
    expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_BACKEND_ERROR);
    expect(t.error).toMatch(/backend_error/);
    expect(t.reward).toBe(0);
    expect(t.rewardDetails).toEqual({});
    expect(t.promptTokenIds.length).toBeGreaterThan(0);
    expect(t.turns.map((x) => x.role)).toEqual([Role.ROLE_ASSISTANT, Role.ROLE_TOOL]);
    expect(t.numTurns).toBe(1);
  });

  it('runs python in the sandbox, not on the host: no network, host files invisible', async () => {
    const probe: FakePolicy = (prompt) =>
      prompt.includes('<tool_response>')
        ? '\\boxed{1}'
        : hermesToolCall('python', {
            code: [
              'import os, socket',
              "print('host-root-visible' if os.path.exists('/work/main/package.json') else 'host-hidden')",
              's = socket.socket()',
              's.settimeout(1)',
              'try:',
              "    s.connect(('127.0.0.1', 22)); print('net-open')",
              'except OSError as e:',
              "    print('net-blocked', e.errno)",
            ].join('\n'),
          });
    h = await startHarness({}, { policy: probe });
    const t = await runOne(h, 'loop-sandboxed');
    const observation = t.messages.find((m) => m.role === 'tool')?.content ?? '';
    expect(observation).toContain('host-hidden');
    expect(observation).toContain('net-blocked');
    expect(observation).not.toContain('net-open');
  });
});
