import { status, type ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PauseMode } from '../../gen/ts/rollout/v1/backend.js';
import { Role, StalenessAction, TrajectoryStatus, type Trajectory, type Turn } from '../../gen/ts/rollout/v1/rollout.js';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../src/tokens/types.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { limits, startServerHarness, type ServerHarness } from '../support/server-harness.js';

// Weight sync through the real gRPC server: PauseGeneration / ResumeGeneration in the three modes while GRPO groups
// of math trajectories run (bubblewrap sandboxes, the python tool) against the fake vLLM (test double) decoding at
// 10 ms per token, so requests are in flight long enough to pause; then drain/remove and dead engines under load.
// Every sampled span is checked against what the engine answered (its onCompletion record).

const OK = [TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED];
const TOKEN = 'weights';
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
const name = (t: Trajectory): string => `${t.taskId}#${t.sampleIndex} ${TrajectoryStatus[t.status]} ${t.finishReason} ${t.error}`;

interface Completion {
  promptIds: number[];
  tokenIds: number[];
  logprobs: number[];
}

let tokenizer: Tokenizer;
beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
});

const assistant = (t: Trajectory): Turn[] => t.turns.filter((x) => x.role === Role.ROLE_ASSISTANT);

/** Each assistant span is exactly one engine answer to exactly the context before it (ids and logprobs). */
function expectVerbatim(t: Trajectory, completions: readonly Completion[]): void {
  const all = [...t.promptTokenIds, ...t.responseTokenIds];
  for (const turn of assistant(t)) {
    const context = all.slice(0, t.promptTokenIds.length + turn.start).join(',');
    const ids = t.responseTokenIds.slice(turn.start, turn.end);
    const match = completions.find(
      (c) => c.promptIds.join(',') === context && c.tokenIds.join(',') === ids.join(',') && c.logprobs.every((p, i) => Math.fround(p) === t.responseLogprobs[turn.start + i]),
    );
    expect(match, `${name(t)}: span [${turn.start}, ${turn.end}) is one engine answer`).toBeDefined();
  }
}

/** Starts a session with `tasks`; `done` resolves with their trajectories. */
async function start(client: RolloutClient, tasks: ReturnType<typeof mathTask>[]): Promise<{ done: Promise<Trajectory[]> }> {
  const session = client.openSession();
  for (const task of tasks) await session.submit(task);
  session.close();
  return { done: collect(session.trajectories()) };
}

describe('PauseGeneration / ResumeGeneration through the server', () => {
  let h: ServerHarness;
  const completions: Completion[] = [];
  let version = 0;

  beforeAll(async () => {
    h = await startServerHarness({
      config: { adminToken: TOKEN },
      engine: { tokenLatencyMs: 10, onCompletion: (c) => completions.push({ promptIds: [...c.promptIds], tokenIds: [...c.tokenIds], logprobs: [...c.logprobs] }) },
    });
  });
  afterAll(async () => h?.close());

  /** Waits until the engine decodes something, then a little more, so the pause lands inside turns. */
  async function midTurn(): Promise<void> {
    await expect.poll(() => h.engine.inflightRequestIds().length, { timeout: 30_000 }).toBeGreaterThan(0);
    await sleep(60);
  }

  it('is admin: no token is UNAUTHENTICATED; mode UNSPECIFIED is INVALID_ARGUMENT naming mode; an unknown backend is NOT_FOUND', async () => {
    const anonymous = new RolloutClient(h.server.address);
    try {
      const err = (await anonymous.pauseGeneration(PauseMode.PAUSE_MODE_ABORT).catch((e: unknown) => e)) as ServiceError;
      expect(err.code).toBe(status.UNAUTHENTICATED);
      const resume = (await anonymous.resumeGeneration({ policyVersion: 1 }).catch((e: unknown) => e)) as ServiceError;
      expect(resume.code).toBe(status.UNAUTHENTICATED);
    } finally {
      anonymous.close();
    }
    const bad = (await h.client.pauseGeneration(PauseMode.PAUSE_MODE_UNSPECIFIED).catch((e: unknown) => e)) as ServiceError;
    expect(bad.code).toBe(status.INVALID_ARGUMENT);
    expect(bad.metadata.get('rollout-field')).toEqual(['mode']);
    const unknown = (await h.client.pauseGeneration(PauseMode.PAUSE_MODE_WAIT, { backendId: 'nope' }).catch((e: unknown) => e)) as ServiceError;
    expect(unknown.code).toBe(status.NOT_FOUND);
    // A version is a count of weight updates: a negative one is refused, naming it (nothing resumed or recorded).
    const negative = (await h.client.resumeGeneration({ policyVersion: -3 }).catch((e: unknown) => e)) as ServiceError;
    expect(negative.code).toBe(status.INVALID_ARGUMENT);
    expect(negative.metadata.get('rollout-field')).toEqual(['policy_version']);
    expect((await h.client.listBackends()).map((b) => [b.paused, b.policyVersion])).toEqual([[false, 0]]);
  });

  it('ABORT: interrupted turns continue after resume as spans of versions v and v+1, one message, every span verbatim', async () => {
    const pending = await start(h.client, [mathTask('abort-a', 4, 11, { includeMessages: true }), mathTask('abort-b', 4, 12, { includeMessages: true })]);
    await midTurn();
    const paused = await h.client.pauseGeneration(PauseMode.PAUSE_MODE_ABORT);
    expect(paused.map((b) => [b.paused, b.policyVersion])).toEqual([[true, version]]);
    expect((await h.client.listBackends())[0]!.paused).toBe(true);
    // Paused: the engine gets nothing new (requests wait in the server) and nothing fails.
    const received = h.engine.stats().received;
    await sleep(200);
    expect(h.engine.stats().received).toBe(received);
    expect(h.engine.inflightRequestIds()).toEqual([]);
    const resumed = await h.client.resumeGeneration({ policyVersion: version + 1 });
    expect(resumed.map((b) => [b.paused, b.policyVersion])).toEqual([[false, version + 1]]);
    const trajectories = await pending.done;
    expect(trajectories).toHaveLength(8);
    let splits = 0;
    for (const t of trajectories) {
      expect(OK, name(t)).toContain(t.status);
      expect(invariantViolations(t)).toEqual([]);
      expectVerbatim(t, completions);
      const spans = assistant(t);
      for (const [k, span] of spans.entries()) {
        if (!span.continuesTurn) continue;
        splits++;
        const before = spans[k - 1]!;
        expect(before.end).toBe(span.start);
        expect(before).toMatchObject({ finishReason: 'abort', policyVersion: version, policyVersionStart: version });
        expect(span).toMatchObject({ policyVersion: version + 1, policyVersionStart: version + 1 });
      }
      // The chat messages know nothing of the cut: one assistant message per turn, decoded from all its spans.
      const turns = spans.filter((s) => !s.continuesTurn).length;
      expect(t.messages.filter((m) => m.role === 'assistant')).toHaveLength(turns);
      expect(t.numTurns).toBe(turns);
    }
    expect(splits, 'turns split by the pause').toBeGreaterThan(0);
    version++;
  });

  it('WAIT: answers once the requests in flight have finished; no turn is cut, later turns carry the new version', async () => {
    const pending = await start(h.client, [mathTask('wait-a', 4, 13)]);
    await midTurn();
    const inflight = h.engine.inflightRequestIds().length;
    expect(inflight).toBeGreaterThan(0);
    await h.client.pauseGeneration(PauseMode.PAUSE_MODE_WAIT);
    expect(h.engine.inflightRequestIds()).toEqual([]);
    const abortedBefore = h.engine.stats().aborted;
    await h.client.resumeGeneration({ policyVersion: version + 1 });
    const trajectories = await pending.done;
    expect(h.engine.stats().aborted).toBe(abortedBefore);
    let later = 0;
    for (const t of trajectories) {
      expect(OK, name(t)).toContain(t.status);
      expect(invariantViolations(t)).toEqual([]);
      expectVerbatim(t, completions);
      for (const span of assistant(t)) {
        expect(span.continuesTurn).toBe(false);
        expect(span.finishReason).not.toBe('abort');
        expect(span.policyVersionStart).toBe(span.policyVersion);
        if (span.policyVersion === version + 1) later++;
      }
    }
    expect(later, 'turns sampled after the resume').toBeGreaterThan(0);
    version++;
  });

  it('KEEP: frozen requests continue after resume, and record that they span the update (start v, end v+1)', async () => {
    const pending = await start(h.client, [mathTask('keep-a', 4, 14)]);
    await midTurn();
    await h.client.pauseGeneration(PauseMode.PAUSE_MODE_KEEP);
    const frozen = h.engine.inflightRequestIds();
    expect(frozen.length).toBeGreaterThan(0);
    await sleep(200);
    expect(h.engine.inflightRequestIds()).toEqual(frozen); // still there: not aborted, not finished
    await h.client.resumeGeneration({ policyVersion: version + 1 });
    const trajectories = await pending.done;
    let mixed = 0;
    for (const t of trajectories) {
      expect(OK, name(t)).toContain(t.status);
      expect(invariantViolations(t)).toEqual([]);
      expectVerbatim(t, completions);
      for (const span of assistant(t)) {
        expect(span.continuesTurn).toBe(false);
        if (span.policyVersionStart !== span.policyVersion) {
          mixed++;
          expect([span.policyVersionStart, span.policyVersion]).toEqual([version, version + 1]);
          expect([t.policyVersionMin, t.policyVersionMax]).toEqual([version, version + 1]);
        }
      }
    }
    // Every frozen request spans the update (a request that reached the engine just as it paused may too).
    expect(mixed).toBeGreaterThanOrEqual(frozen.length);
    version++;
  });

  it('max_staleness with FLAG: a trajectory whose turns span two versions is delivered stale, reward computed', async () => {
    const task = mathTask('stale-flag', 4, 15, { limits: { ...limits({}), maxStaleness: 0, stalenessAction: StalenessAction.STALENESS_ACTION_FLAG } });
    const pending = await start(h.client, [task]);
    await midTurn();
    await h.client.pauseGeneration(PauseMode.PAUSE_MODE_WAIT);
    await h.client.resumeGeneration({ policyVersion: version + 1 });
    const trajectories = await pending.done;
    let stale = 0;
    for (const t of trajectories) {
      expect(OK, name(t)).toContain(t.status);
      expect(t.stale, name(t)).toBe(t.policyVersionMax - t.policyVersionMin > 0);
      expect(t.stalenessRestarts).toBe(0);
      if (t.stale) stale++;
    }
    expect(stale).toBeGreaterThan(0);
    version++;
  });

  it('max_staleness with RESTART: a sample too stale runs again from scratch and is delivered fresh', async () => {
    const task = mathTask('stale-restart', 4, 16, { limits: { ...limits({}), maxStaleness: 0, stalenessAction: StalenessAction.STALENESS_ACTION_RESTART } });
    const pending = await start(h.client, [task]);
    await midTurn();
    await h.client.pauseGeneration(PauseMode.PAUSE_MODE_WAIT);
    await h.client.resumeGeneration({ policyVersion: version + 1 });
    const trajectories = await pending.done;
    expect(trajectories).toHaveLength(4);
    let restarted = 0;
    for (const t of trajectories) {
      expect(OK, name(t)).toContain(t.status);
      expect(t.stale).toBe(false);
      expect(t.policyVersionMax - t.policyVersionMin).toBe(0);
      if (t.stalenessRestarts > 0) {
        restarted++;
        expect(t.policyVersionMin).toBe(version + 1);
      }
    }
    expect(restarted).toBeGreaterThan(0);
    version++;
  });

  it('refuses a negative max_staleness naming the field', async () => {
    const err = (await h.client.submit(mathTask('stale-bad', 1, 17, { limits: { ...limits({}), maxStaleness: -1 } })).catch((e: unknown) => e)) as ServiceError;
    expect(err.code).toBe(status.INVALID_ARGUMENT);
    expect(err.metadata.get('rollout-field')).toEqual(['task.limits.max_staleness']);
  });
});

describe('engines leaving under load', () => {
  let h: ServerHarness;
  const extra: FakeVllmEngine[] = [];
  beforeAll(async () => {
    h = await startServerHarness({ config: { adminToken: TOKEN }, engine: { tokenLatencyMs: 2 } });
  });
  afterAll(async () => {
    await h?.close();
    for (const e of extra) await e.close();
  });

  async function addEngine(id: string, tokenLatencyMs = 2): Promise<FakeVllmEngine> {
    const engine = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs });
    extra.push(engine);
    await h.client.addBackend({ url: engine.url, id, maxConcurrency: 64, model: engine.model });
    return engine;
  }

  const tasks = (prefix: string, n: number) => Array.from({ length: n }, (_, k) => mathTask(`${prefix}-${k}`, 4, 300 + k));

  it('drain and remove one engine at a time while trajectories run: nothing fails, drained engines get nothing new', async () => {
    const a = await addEngine('a');
    const b = await addEngine('b');
    const pending = await start(h.client, tasks('drain', 6));
    await expect.poll(() => a.stats().received + b.stats().received, { timeout: 30_000 }).toBeGreaterThan(0);
    await h.client.removeBackend('a', true);
    const afterA = a.stats().received;
    await h.client.removeBackend('b', true);
    const trajectories = await pending.done;
    expect(trajectories).toHaveLength(24);
    for (const t of trajectories) {
      expect(OK, name(t)).toContain(t.status);
      expect(invariantViolations(t)).toEqual([]);
    }
    expect(a.stats().received).toBe(afterA);
    expect((await h.client.listBackends()).map((x) => x.id)).toHaveLength(1);
  });

  it('remove without drain while trajectories run: their requests move to the other engine, nothing fails', async () => {
    const slow = await addEngine('slow', 20);
    const pending = await start(h.client, tasks('yank', 4));
    await expect.poll(() => slow.stats().inflight, { timeout: 30_000 }).toBeGreaterThan(0);
    await h.client.removeBackend('slow', false);
    const trajectories = await pending.done;
    for (const t of trajectories) expect(OK, name(t)).toContain(t.status);
    expect(trajectories.some((t) => t.turns.some((x) => x.backend === 'slow'))).toBe(false);
  });

  it('an engine killed mid-run: its trajectories finish on the other engine; none fails, none hangs', async () => {
    const doomed = await addEngine('doomed', 20);
    const pending = await start(h.client, tasks('killed', 4));
    await expect.poll(() => doomed.stats().inflight, { timeout: 30_000 }).toBeGreaterThan(0);
    await doomed.close();
    const trajectories = await pending.done;
    for (const t of trajectories) {
      expect(OK, name(t)).toContain(t.status);
      expect(invariantViolations(t)).toEqual([]);
    }
    const doomedInfo = (await h.client.listBackends()).find((x) => x.id === 'doomed');
    expect(doomedInfo).toMatchObject({ healthy: false, inflightTrajectories: 0 });
  });
});

/**
 * Makes an answer an abort cut after its first token: finish "abort", one token kept (never the turn's last, which
 * would end the turn: an abort whose tokens end the turn ends it, as an uninterrupted request would —
 * review-s36-abort-after-stop). The fake engine answers each continuation with the rest of its answer, so every
 * request of the turn is aborted one token further in.
 */
function abortAfterOneToken(choice: Record<string, unknown>, answer: Record<string, unknown>): void {
  choice.finish_reason = 'abort';
  // The ids as the client asks for them: token_ids when return_token_ids, else logprobs.tokens as "token_id:<id>".
  const lp = choice.logprobs as { text_offset: number[]; token_logprobs: number[]; tokens: string[]; top_logprobs: unknown[] };
  const ids = (choice.token_ids as number[] | null) ?? lp.tokens.map((t) => Number(t.replace(/^token_id:/, '')));
  if (ids.length < 2) return;
  if (choice.token_ids !== null) choice.token_ids = ids.slice(0, 1);
  choice.logprobs = { text_offset: lp.text_offset.slice(0, 1), token_logprobs: lp.token_logprobs.slice(0, 1), tokens: lp.tokens.slice(0, 1), top_logprobs: lp.top_logprobs.slice(0, 1) };
  const usage = answer.usage as { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  answer.usage = { ...usage, completion_tokens: 1, total_tokens: usage.prompt_tokens + 1 };
}

describe('an engine that aborts every request', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({
      config: { maxContinuationsPerTurn: 3 },
      engine: { inject: () => ({ kind: 'tamper', tamper: abortAfterOneToken }) },
    });
  });
  afterAll(async () => h?.close());

  it('ends BACKEND_ERROR after maxContinuationsPerTurn continuations of one turn, never loops; what it sampled is kept for debugging', async () => {
    const [t] = await (await start(h.client, [mathTask('always-aborted', 1, 18)])).done;
    expect(t!.status, name(t!)).toBe(TrajectoryStatus.TRAJECTORY_STATUS_BACKEND_ERROR);
    expect(t!.error).toMatch(/turn 0 was aborted 4 times .*at most 3 continuations per turn/);
    expect(h.engine.stats().received).toBe(4);
    const spans = assistant(t!);
    expect(spans.map((s) => [s.finishReason, s.continuesTurn])).toEqual([['abort', false], ['abort', true], ['abort', true], ['abort', true]]);
    expect(invariantViolations(t!)).toEqual([]);
  });
});

describe('an engine that aborts requests before their first token', () => {
  let h: ServerHarness;
  let emptyAborts = 0;
  const seeds: unknown[] = [];
  const empty = (choice: Record<string, unknown>, answer: Record<string, unknown>): void => {
    choice.finish_reason = 'abort';
    choice.text = '';
    choice.logprobs = { text_offset: [], token_logprobs: [], tokens: [], top_logprobs: [] };
    // As vLLM counts a request aborted before its first step: no token (an answer whose usage disagrees is refused).
    answer.usage = { prompt_tokens: (answer.usage as { prompt_tokens: number }).prompt_tokens, completion_tokens: 0, total_tokens: (answer.usage as { prompt_tokens: number }).prompt_tokens };
  };
  beforeAll(async () => {
    h = await startServerHarness({
      config: { maxContinuationsPerTurn: 3 },
      engine: {
        inject: ({ body }) => {
          seeds.push(body.seed);
          if (emptyAborts === 0) return undefined;
          emptyAborts--;
          return { kind: 'tamper', tamper: empty };
        },
      },
    });
  });
  afterAll(async () => h?.close());

  it('asks again with the same seed: a seeded turn does not depend on how many pauses hit it before its first token', async () => {
    const [clean] = await (await start(h.client, [mathTask('never-aborted', 1, 21)])).done;
    const cleanSeeds = seeds.splice(0);
    emptyAborts = 2;
    const [hit] = await (await start(h.client, [mathTask('aborted-twice-empty', 1, 21)])).done;
    expect(hit!.status, name(hit!)).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
    // The first turn was asked three times, each with the turn's seed; the rest as in the clean run.
    expect(seeds.slice(0, 3)).toEqual([cleanSeeds[0], cleanSeeds[0], cleanSeeds[0]]);
    expect(seeds.slice(2)).toEqual(cleanSeeds);
    expect(hit!.responseTokenIds).toEqual(clean!.responseTokenIds);
    expect(assistant(hit!).map((s) => s.continuesTurn)).toEqual(assistant(clean!).map(() => false));
    expect(invariantViolations(hit!)).toEqual([]);
  });

  it('ends BACKEND_ERROR once aborts before a first token pass the bound, never loops', async () => {
    seeds.length = 0;
    emptyAborts = 1_000;
    const [t] = await (await start(h.client, [mathTask('always-aborted-empty', 1, 22)])).done;
    emptyAborts = 0;
    expect(t!.status, name(t!)).toBe(TrajectoryStatus.TRAJECTORY_STATUS_BACKEND_ERROR);
    expect(t!.error).toMatch(/turn 0's request was aborted before its first token 4 times .*at most 3/);
    expect(seeds).toHaveLength(4);
    expect(t!.responseTokenIds).toEqual([]);
  });
});
