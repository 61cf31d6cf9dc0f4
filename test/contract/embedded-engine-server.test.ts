import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { LogprobsMode } from '../../gen/ts/rollout/v1/backend.js';
import { Role, TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { EmbeddedEngineClient } from '../../src/backends/embedded/embedded-engine.js';
import { TINY_QWEN3_URL } from '../../src/backends/embedded/embedded-url.js';
import type { GenerateRequest, GenerateResult } from '../../src/backends/types.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

describe('the whole server on the embedded llama.cpp engine', () => {
  let h: ServerHarness;
  // Every answer the engine built from the config gave, recorded at the EngineClient seam.
  const generate = vi.spyOn(EmbeddedEngineClient.prototype, 'generate');
  beforeAll(async () => {
    // No maxConcurrency: the backend's capacity is the engine's own (its two sequences).
    h = await startServerHarness({ config: { backends: [{ kind: 'embedded', url: `${TINY_QWEN3_URL}?sequences=2` }] } });
  }, 120_000);
  afterAll(async () => {
    generate.mockRestore();
    await h?.close();
  });

  it('returns trajectories whose sampled ids and logprobs are exactly what the engine produced', async () => {
    const session = h.client.openSession();
    await session.submit(mathTask('embedded-e2e', 2, 5, { sampling: { temperature: 1, seed: 5, maxTokensPerTurn: 24, maxTotalTokens: 4096, stop: [] } }));
    session.close();
    const trajectories = await collect(session.trajectories());
    expect(trajectories).toHaveLength(2);

    const answers: { request: GenerateRequest; result: GenerateResult }[] = [];
    for (const [i, call] of generate.mock.calls.entries()) {
      const settled = generate.mock.settledResults[i];
      if (settled?.type === 'fulfilled') answers.push({ request: call[0], result: settled.value });
    }
    expect(answers.length).toBeGreaterThanOrEqual(2);
    for (const t of trajectories) {
      // Random weights write random text: the sample ends unrewarded, never as an infrastructure failure.
      expect([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED]).toContain(t.status);
      expect(invariantViolations(t)).toEqual([]);
      expect(t.logprobsMode).toBe(LogprobsMode.LOGPROBS_MODE_PROCESSED); // llama.cpp's confidence: the sampling distribution's
      const all = [...t.promptTokenIds, ...t.responseTokenIds];
      const assistant = t.turns.filter((x) => x.role === Role.ROLE_ASSISTANT);
      expect(assistant.length).toBeGreaterThan(0);
      for (const turn of assistant) {
        const context = all.slice(0, t.promptTokenIds.length + turn.start).join(',');
        const ids = t.responseTokenIds.slice(turn.start, turn.end);
        const logprobs = t.responseLogprobs.slice(turn.start, turn.end);
        const match = answers.filter(
          (a) =>
            a.request.promptIds.join(',') === context &&
            a.result.tokenIds.length === ids.length &&
            a.result.tokenIds.every((x, i) => x === ids[i]) &&
            a.result.logprobs.every((x, i) => Math.fround(x) === logprobs[i]), // proto float
        );
        expect(match.length, `engine answer for ${t.taskId}#${t.sampleIndex} turn at ${turn.start}`).toBeGreaterThan(0);
        expect(logprobs.every((p) => p <= 0)).toBe(true);
      }
    }
    // The group's samples were sampled with different seeds, so they differ.
    expect(trajectories[0]!.responseTokenIds).not.toEqual(trajectories[1]!.responseTokenIds);
  });

  it('lists the embedded backend as healthy with its context size, its sequences as capacity and processed logprobs', async () => {
    const [backend] = h.server.pool.list();
    expect(backend).toMatchObject({ kind: 'embedded', healthy: true, maxConcurrency: 2, capacitySource: 'engine', logprobsMode: 'processed' });
    expect(backend!.maxModelLen).toBeGreaterThanOrEqual(4096);
  });
});
