import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { TaskInput } from '../../src/client/rollout-client.js';
import { defineEnvironment } from '../../src/environments/define.js';
import { EnvironmentRegistry } from '../../src/environments/registry.js';
import { RolloutError } from '../../src/errors.js';
import { hermesToolCall } from '../../src/testing/scripted-policy.js';
import { createBashTool } from '../../src/tools/bash-tool.js';
import { defineTool } from '../../src/tools/define-tool.js';
import { collect, invariantViolations } from '../support/harness.js';
import { limits, startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { within } from '../support/wait.js';

// Review s40. A tool call that ran past the sandbox's wall clock failed deadline_exceeded (TIMEOUT), and so did every
// later call; a tool call that ran past the run stage's deadline ended the sample TIMEOUT too. Trainers drop TIMEOUT as
// infrastructure noise, so a policy heading for reward 0 could stall its way out of it (`sleep 100000`). The model's
// tool calls now share a tool-time budget of the episode (run.toolTimeShare of the run timeout, ending before the
// sandbox's wall clock less the evaluation's reserve): using it up ends the episode TRUNCATED, finish_reason
// "tool_time_budget", and the evaluation still runs in the live sandbox. Real server, real bubblewrap sandboxes, the
// fake vLLM engine (test double) playing a scripted policy.

/** The policy of the next request (set by each test): its text from the prompt and how many tool responses it holds. */
let policy: (toolResponses: number, prompt: string) => string = () => 'done';
/** Engine requests from this index on take 10 minutes (an engine that stopped answering). */
let stallFrom = Infinity;
/** The engine request of this index takes `slowMs` (a slow engine, answering in the end). */
let slowAt = -1;
let slowMs = 0;
const engineLatency = ({ index }: { index: number }): number => (index >= stallFrom ? 600_000 : index === slowAt ? slowMs : 0);

/**
 * TEST ENVIRONMENT: "write 42 to answer.txt", a bash tool with the instance's per-command timeout (and the sandbox's
 * wall clock the instance asks for) and a `kill_sandbox`
 * tool (stops the sandbox under the episode: a sandbox that died). Graded in the sample's own sandbox (`cat
 * answer.txt`): a reward there proves the evaluation ran in a live sandbox after the episode.
 */
const answerFile = defineEnvironment({
  name: 'answer-file',
  description: 'write 42 to answer.txt; graded by reading it in the sandbox',
  instance: z.object({ commandMs: z.number().int().positive().default(30_000), wallClockMs: z.number().int().positive().optional() }),
  sandbox: (instance) => (instance.wallClockMs === undefined ? {} : { limits: { wallClockMs: instance.wallClockMs } }),
  prompt: () => [{ role: 'user', content: 'Write 42 to answer.txt, then say done.' }],
  tools: (instance) => [
    createBashTool({ timeoutMs: instance.commandMs }),
    defineTool({
      name: 'kill_sandbox',
      description: 'test only',
      args: z.object({}),
      async run(_args, { sandbox }) {
        await sandbox.stop();
        await sandbox.shell().run('true');
        return { output: 'unreachable', outcome: 'ok' };
      },
    }),
  ],
  toolNames: ['bash', 'kill_sandbox'],
  async evaluate({ sandbox, signal, outcome }) {
    const r = await sandbox.exec(['cat', 'answer.txt'], { signal, timeoutMs: 10_000 });
    if (r.timedOut) throw new RolloutError('deadline_exceeded', 'grading timed out');
    const read = r.stdout.trim();
    return { reward: read === '42' ? 1 : 0, details: { correct: read === '42' ? 1 : 0 }, report: { read, finish: outcome.finishReason } };
  },
});

const bash = (command: string): string => hermesToolCall('bash', { command });
const name = (t: Trajectory): string => `${TrajectoryStatus[t.status]} ${t.finishReason} ${t.error}`;

function task(taskId: string, extra: Partial<TaskInput> = {}, instance: Record<string, unknown> = {}): TaskInput {
  return { taskId, environment: 'answer-file', numSamples: 1, instance, includeMessages: true, sampling: { temperature: 1, seed: 1, maxTokensPerTurn: 128, maxTotalTokens: 4096, stop: [] }, ...extra };
}

async function run(h: ServerHarness, input: TaskInput): Promise<{ t: Trajectory; tookMs: number }> {
  const started = Date.now();
  const session = h.client.openSession();
  await session.submit(input);
  session.close();
  const [t] = await within(collect(session.trajectories()), 60_000, `task ${input.taskId}`);
  expect(invariantViolations(t!)).toEqual([]);
  return { t: t!, tookMs: Date.now() - started };
}

/**
 * One normal episode, so the server's token threads and the engine connection are warm before the timed tests: a cold
 * first render can take seconds on a loaded box, which is the server's time (TIMEOUT), not the policy's.
 */
async function warmUp(h: ServerHarness): Promise<void> {
  policy = (n) => (n === 0 ? bash('true') : 'done');
  const { t } = await run(h, task(`warm-up-${Math.random()}`));
  expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_COMPLETED');
}

/** Writes the answer, then stalls in every later call. */
const writeThenStall = (n: number): string => (n === 0 ? bash('echo 42 > answer.txt') : bash('sleep 100000'));

function expectTruncatedByToolTime(t: Trajectory): void {
  expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_TRUNCATED');
  expect(t.finishReason).toBe('tool_time_budget');
  expect(t.error).toBe('');
  // Graded by the evaluation, in the sample's sandbox, after the stall.
  expect(t.reward).toBe(1);
  expect(t.evalReport).toEqual({ read: '42', finish: 'tool_time_budget' });
}

describe('the tool-time budget of an episode (run.toolTimeShare of the run timeout, ending before the run deadline)', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({
      registry: new EnvironmentRegistry().register(answerFile),
      engine: { policy: (prompt) => policy(prompt.split('<tool_response>').length - 1, prompt), requestLatencyMs: engineLatency },
    });
    await warmUp(h);
  });
  afterAll(async () => h?.close());

  it('a policy that sleeps past it ends TRUNCATED (finish_reason tool_time_budget) with the reward its evaluation gave, not TIMEOUT', async () => {
    policy = writeThenStall;
    // Budget: 9 s of 10 s at the default share, the run deadline's margin 2 s: cut 8 s after the run stage began. The
    // bash tool's own timeout (30 s) and the sandbox's wall clock are far away.
    const runTimeoutMs = 10_000;
    const { t, tookMs } = await run(h, task('stall', { limits: limits({ runTimeoutMs }) }));
    expectTruncatedByToolTime(t);
    // Cut 8 s in (the run deadline less its margin, inside the 9 s budget), before the run stage's deadline.
    expect(tookMs).toBeGreaterThanOrEqual(5_000);
    expect(t.timing!.toolMs).toBeGreaterThanOrEqual(5_000);
    expect(t.timing!.toolMs).toBeLessThan(runTimeoutMs);
    expect(t.numTurns).toBe(2);
  });

  it("a policy that stalls after a slow engine turn is cut before the run stage's deadline (TRUNCATED), though its budget is not used up", async () => {
    policy = writeThenStall;
    // The second engine request (the turn after `echo 42`) takes 5 s of the 10 s run timeout: 5 s of tool budget are
    // still left when the model starts `sleep 100000`, but the run deadline comes first. The model holds the clock when
    // the episode's time runs out: cut 2 s before the deadline (runMarginMs), TRUNCATED and graded, not TIMEOUT.
    slowAt = h.engine.stats().received + 1;
    slowMs = 5_000;
    try {
      const runTimeoutMs = 10_000;
      const { t } = await run(h, task('slow-engine-stall', { limits: limits({ runTimeoutMs }) }));
      expectTruncatedByToolTime(t);
      // Cut by the deadline's margin, not by the budget (9 s of the 10 s at the default share).
      expect(t.timing!.toolMs).toBeLessThan(6_000);
      expect(t.timing!.runMs).toBeLessThan(runTimeoutMs);
    } finally {
      slowAt = -1;
    }
  });

  it('a command cut by its own timeout is an observation the model sees; the episode goes on and completes', async () => {
    policy = (n, prompt) => (n === 0 ? bash('sleep 100000') : n === 1 ? bash('echo 42 > answer.txt') : prompt.includes('timed out after 1 s') ? 'done' : 'no timeout seen');
    const { t } = await run(h, task('own-timeout', { limits: limits({ runTimeoutMs: 60_000 }) }, { commandMs: 1_000 }));
    expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_COMPLETED');
    expect(t.finishReason).toBe('answer');
    expect(t.reward).toBe(1);
    expect(t.messages.find((m) => m.role === 'tool')!.content).toContain('[timed out after 1 s; the command was interrupted]');
    expect(t.messages.at(-1)!.content).toBe('done');
  });

  it('a normal episode is unchanged: COMPLETED, finish_reason answer, graded', async () => {
    policy = (n) => (n === 0 ? bash('echo 42 > answer.txt') : 'done');
    const { t } = await run(h, task('normal'));
    expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_COMPLETED');
    expect(t.finishReason).toBe('answer');
    expect(t.reward).toBe(1);
    expect(t.evalReport).toEqual({ read: '42', finish: 'answer' });
    // And a wrong answer is a reward of 0, still COMPLETED.
    policy = (n) => (n === 0 ? bash('echo 41 > answer.txt') : 'done');
    const wrong = (await run(h, task('wrong'))).t;
    expect(TrajectoryStatus[wrong.status], name(wrong)).toBe('TRAJECTORY_STATUS_COMPLETED');
    expect(wrong.reward).toBe(0);
  });

  it('a sandbox that dies under a tool call stays SANDBOX_ERROR', async () => {
    policy = (n) => (n === 0 ? hermesToolCall('kill_sandbox', {}) : 'done');
    const { t } = await run(h, task('died'));
    expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_SANDBOX_ERROR');
  });

  it("an engine turn that ends past the tool calls' end (in the run deadline's margin) is TIMEOUT: the engine held the clock, the model's call never ran", async () => {
    // CI run of stop 39: stage-failures' run-tool-hang (run timeout 300 ms, margin 150 ms) ended TRUNCATED
    // tool_time_budget when the first engine turn took over 50 ms on a loaded box: its tool call was refused "budget
    // used up" though no tool had run. Here the first engine turn takes 8.5 s of a 10 s run timeout (tool calls end at
    // 8 s): the time ran out while the engine held it.
    slowAt = h.engine.stats().received;
    slowMs = 8_500;
    policy = (n) => (n === 0 ? bash('echo 42 > answer.txt') : 'done');
    try {
      const runTimeoutMs = 10_000;
      const { t } = await run(h, task('engine-used-the-time', { limits: limits({ runTimeoutMs }) }));
      expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_TIMEOUT');
      expect(t.error).toMatch(/run stage timed out.*engine/);
      expect(t.timing!.toolMs).toBe(0);
      // Ended as the engine's turn ended, not 1.5 s later at the run stage's own deadline.
      expect(t.timing!.runMs).toBeLessThan(runTimeoutMs);
    } finally {
      slowAt = -1;
    }
  });

  it('an engine that stops answering after the model used tool time stays TIMEOUT at the run deadline', async () => {
    // Every request of this task after its first takes 10 minutes: the engine, not the policy, holds the episode.
    stallFrom = h.engine.stats().received + 1;
    policy = (n) => (n === 0 ? bash('sleep 1; echo 42 > answer.txt') : 'done');
    // Budget 4 s: the 1 s command is well inside it (a loaded box's shell start included).
    const runTimeoutMs = 8_000;
    const { t } = await run(h, task('engine-stall', { limits: limits({ runTimeoutMs }) }));
    stallFrom = Infinity;
    expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_TIMEOUT');
    expect(t.error).toContain(`run stage timed out after ${runTimeoutMs} ms`);
    expect(t.timing!.toolMs).toBeGreaterThanOrEqual(1_000);
  });

  it("a policy that sleeps into the sandbox's wall clock ends TRUNCATED and is graded in the still-live sandbox (the evaluation's reserve)", async () => {
    policy = writeThenStall;
    // 10 s of sandbox life: the evaluation keeps min(eval timeout, a quarter of it) = 2.5 s; the budget (300 s) is far.
    const { t, tookMs } = await run(h, task('wall-clock', {}, { wallClockMs: 10_000 }));
    expectTruncatedByToolTime(t);
    // Cut at the sandbox's 10 s less the evaluation's 2.5 s, graded within them. The cut is scheduled for that moment
    // (counted from before the sandbox started); toolMs also holds the kill and its report after it, which under load
    // took 28 ms past it (7,528 ms: a flake of the bound without room), so the bound allows 1 s for them — far from a
    // tool left to run into the wall clock (10 s).
    expect(t.timing!.toolMs).toBeLessThan(10_000 - 2_500 + 1_000);
    expect(t.timing!.initMs + t.timing!.runMs + t.timing!.evalMs).toBeLessThan(10_000);
    expect(tookMs).toBeLessThan(20_000);
  });
});
