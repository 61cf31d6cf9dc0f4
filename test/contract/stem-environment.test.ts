import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { hermesToolCall, latestToolResponse, type FakePolicy } from '../../src/testing/scripted-policy.js';
import { collect, invariantViolations } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

/**
 * The stem environment end to end: real server and sandboxes, the fake vLLM engine (test double) as a scripted
 * student who computes with the python tool, answers in another unit through finish, or picks a letter in prose.
 */
const student: FakePolicy = (prompt) => {
  if (prompt.includes('A) ')) return prompt.includes('noble') ? 'Argon has a full shell. The answer is (B).' : 'The answer is (A).';
  const observed = latestToolResponse(prompt);
  if (observed === undefined) return hermesToolCall('python', { code: 'print(36 / 3.6 * 1000)' }); // m/s → m per 1000 s
  return hermesToolCall('finish', { answer: `${Number(observed) / 1000} km` });
};

describe('the stem environment through a real server', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({ engine: { policy: student } });
  });
  afterAll(async () => h?.close());

  it('scores a multiple-choice pick and a numeric answer converted from another unit', async () => {
    const { environments } = await h.client.listEnvironments();
    expect(environments.find((e) => e.name === 'stem')?.tools).toEqual(['python', 'finish']);
    const session = h.client.openSession();
    const sampling = { temperature: 1, seed: 1, maxTokensPerTurn: 256, maxTotalTokens: 4096, stop: [] };
    await session.submit({ taskId: 'mc-right', environment: 'stem', numSamples: 2, sampling, instance: { question: 'Which is a noble gas?', choices: ['Nitrogen', 'Argon', 'Oxygen'], answer: 'Argon' } });
    await session.submit({ taskId: 'mc-wrong', environment: 'stem', numSamples: 1, sampling, instance: { question: 'Which is a metal?', choices: ['Sulfur', 'Iron'], answer: 'B' } });
    await session.submit({ taskId: 'distance', environment: 'stem', numSamples: 1, sampling, instance: { question: 'A car goes 36 km/h for 1000 s. How far, in m?', answer: 10_000, unit: 'm' }, includeMessages: true });
    const bad = await session.submit({ taskId: 'bad', environment: 'stem', numSamples: 1, instance: { question: 'q', choices: ['a', 'b'], answer: 'Z' } }).catch((e: unknown) => e);
    expect(bad).toMatchObject({ field: 'instance.answer' });
    session.close();
    const byId = new Map((await collect(session.trajectories())).map((t) => [`${t.taskId}#${t.sampleIndex}`, t]));
    expect(byId.size).toBe(4);
    for (const t of byId.values()) {
      expect(t.status, t.error).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
      expect(invariantViolations(t)).toEqual([]);
    }
    expect(byId.get('mc-right#0')).toMatchObject({ reward: 1, evalReport: { chosen: 'B', source: 'answer_phrase' } });
    expect(byId.get('mc-wrong#0')).toMatchObject({ reward: 0, evalReport: { chosen: 'A', correct_choice: 'B' } });
    const distance = byId.get('distance#0')!;
    expect(distance).toMatchObject({ reward: 1, evalReport: { source: 'finish_tool', extracted: '10 km', converted: 10_000, reason: 'within_tolerance' } });
    expect(distance.messages.find((m) => m.role === 'tool')?.content).toBe('10000.0');
  });
});
