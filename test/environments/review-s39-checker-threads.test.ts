import fc from 'fast-check';
import { afterAll, describe, expect, it } from 'vitest';
import { loadAnswerPairs } from '../../bench/math/agreement.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { RolloutError } from '../../src/errors.js';
import { CheckPool } from '../../src/environments/math/check-pool.js';
import { runCheckTask, type CheckTask } from '../../src/environments/math/check-tasks.js';
import { checkEquivalence } from '../../src/environments/math/equivalence.js';
import { createMathEnvironment } from '../../src/environments/math/math-environment.js';
import { resolveChoice } from '../../src/environments/stem/choice.js';
import { compareQuantity } from '../../src/environments/stem/quantity.js';
import { createStemEnvironment } from '../../src/environments/stem/stem-environment.js';
import { mathjsUnits } from '../../src/environments/stem/units.js';
import type { Evaluation } from '../../src/environments/types.js';
import { ToolRegistry } from '../../src/tools/registry.js';
import type { Tool } from '../../src/tools/types.js';
import { collect } from '../support/harness.js';
import { startServerHarness } from '../support/server-harness.js';
import { within } from '../support/wait.js';
import { FakeSandbox } from './fake-sandbox.js';

/**
 * The built-in answer checkers (math equivalence, STEM quantities and choices) run on checker threads, not on the event
 * loop that serves every trainer's stream: same verdicts as direct calls, the event loop free while a hostile answer is
 * checked, a check stuck in a loop ended as checker_limit (reward 0) with its thread replaced, a thread that dies or
 * cannot start an infrastructure failure, and the server's threads closed when it stops.
 */

const FAULTY = new URL('../support/faulty-check-worker.mjs', import.meta.url);

/** A set of sixteen high powers: ~40-60 ms of the checker's time on an idle core (measured), all of it a blocked event loop when inline. */
function hostileSet(shift: number): string {
  const element = (i: number): string => `(x+${i})^{300}+(y-${i})^{299}+(x+y)^{${298 + shift}}`;
  return `\\{${Array.from({ length: 16 }, (_, i) => element(i)).join(',')}\\}`;
}

function fakeTool(name: string): Tool {
  return { name, description: name, parameters: { type: 'object' }, run: async () => ({ output: '', outcome: 'ok' }) };
}
const toolRegistry = new ToolRegistry().register('python', () => fakeTool('python')).register('bash', () => fakeTool('bash')).register('finish', () => fakeTool('finish'));

function evaluateMath(math: ReturnType<typeof createMathEnvironment>, answer: string, reference: string): Promise<Evaluation> {
  const instance = math.validate({ problem: 'p', answer: reference });
  return math.evaluate({ instance, sandbox: new FakeSandbox(), signal: new AbortController().signal, outcome: { messages: [], finishAnswer: answer, finishReason: 'finish_tool' } });
}

const pools: CheckPool[] = [];
function pool(options: ConstructorParameters<typeof CheckPool>[0] = {}): CheckPool {
  const p = new CheckPool(options);
  pools.push(p);
  return p;
}
afterAll(async () => {
  await Promise.all(pools.map((p) => p.close()));
});

describe('answer checks on checker threads', () => {
  it('give the verdicts of direct calls: the agreement corpus, generated pairs, hostile ones, STEM quantities and choices', async () => {
    const threads = pool({ size: 2 });
    const tasks: CheckTask[] = [];
    for (const { pred, gold } of loadAnswerPairs()) {
      tasks.push({ kind: 'equivalence', predicted: pred, reference: gold }, { kind: 'equivalence', predicted: gold, reference: pred });
    }
    const mathy = fc.string({
      unit: fc.constantFrom(...'0123456789.,-+*/^()[]{}%$=\\ xyeE'.split(''), '\\frac', '\\sqrt', '\\pi', '\\{', '\\}', '\\pm', '\\cup', ' or ', '\\text{cm}'),
      maxLength: 40,
    });
    const generated = fc.sample(fc.tuple(fc.oneof(mathy, fc.string({ maxLength: 30 }), fc.stringMatching(/^[0-9a-z.+\-/]{1,12}$/)), mathy), { numRuns: 1500, seed: 39 });
    for (const [a, b] of generated) tasks.push({ kind: 'equivalence', predicted: a, reference: b }, { kind: 'equivalence', predicted: a, reference: a });
    tasks.push({ kind: 'equivalence', predicted: hostileSet(0), reference: hostileSet(1) }, { kind: 'equivalence', predicted: ' ', reference: '1' });
    const references = [
      { value: 9.8, percent: false, unitText: 'm/s^2', tolerance: 0.01 },
      { value: 5000, percent: false, unitText: 'm', tolerance: 0 },
      { value: 45, percent: true, unitText: '', tolerance: 0.01 },
      { value: 300, percent: false, unitText: 'K', tolerance: 0.02 },
    ];
    for (const answer of ['9.81 m/s^2', '5 km', '5000', '0.45', '45%', '27 °C', '26.85 degC', '3 kg', 'about 9.8', '1e-400 m', 'x']) {
      for (const reference of references) tasks.push({ kind: 'quantity', answer, reference });
    }
    for (const plain of ['0.5', '1/2', '\\frac{2}{4}', '42 J', 'x+1', '2']) tasks.push({ kind: 'choice', plain, choices: ['1/2', '0.25', '2', '1+x'] });

    const onThreads = await Promise.all(tasks.map((t) => threads.check(t)));
    onThreads.forEach((outcome, i) => expect(outcome, JSON.stringify(tasks[i])).toEqual({ result: runCheckTask(tasks[i]!) }));
    expect(threads.stats.threaded).toBeGreaterThan(tasks.length / 2);
    // runCheckTask is the public functions themselves:
    for (const t of tasks.slice(0, 200)) if (t.kind === 'equivalence') expect(runCheckTask(t)).toEqual(checkEquivalence(t.predicted, t.reference));
    const quantity = tasks.find((t) => t.kind === 'quantity' && t.reference.unitText === 'm')!;
    if (quantity.kind === 'quantity') expect(runCheckTask(quantity)).toEqual(compareQuantity(quantity.answer, { ...quantity.reference, unit: mathjsUnits.parse('m') }, mathjsUnits));
    expect(runCheckTask({ kind: 'choice', plain: '0.5', choices: ['1/2', '2'] })).toBe(resolveChoice('0.5', ['1/2', '2']));
  }, 120_000);

  it('leave the event loop turning while a hostile answer is checked', async () => {
    const threads = pool({ size: 1 });
    const math = createMathEnvironment({ toolRegistry, checkPool: threads });
    await evaluateMath(math, '1/3', '0.5'); // the thread has started
    let ticks = 0;
    let ticking = true;
    const tick = (): void => {
      ticks++;
      if (ticking) setImmediate(tick);
    };
    setImmediate(tick);
    const before = ticks;
    // Inline, the whole check ran inside evaluate() before it returned (no await comes first): not one tick during it.
    const result = await evaluateMath(math, hostileSet(0), hostileSet(1));
    const during = ticks - before;
    ticking = false;
    expect(result).toMatchObject({ reward: 0, report: { comparison: 'elements' } });
    expect(during).toBeGreaterThan(0);
    expect(threads.stats.threaded).toBe(2);
  }, 60_000);

  it('end a check stuck in a loop as checker_limit (reward 0), replacing its thread', async () => {
    // The wall-time backstop far off: on a loaded machine the spinning thread (below normal priority) may get little CPU.
    const threads = pool({ size: 1, checkCpuMs: 300, starvedAfterMs: 600_000, script: FAULTY });
    const math = createMathEnvironment({ toolRegistry, checkPool: threads });
    expect(await evaluateMath(math, '\\frac{1}{2}', '0.5')).toMatchObject({ reward: 1 });
    const [first] = threads.threadIds();
    const stuck = await within(evaluateMath(math, 'SPIN-FOREVER', '0.5'), 100_000, 'the stuck check ended');
    expect(stuck).toMatchObject({ reward: 0, details: { correct: 0, has_answer: 1 }, report: { checker: 'builtin', checker_limit: 'no verdict within 300 ms of CPU time' } });
    expect(threads.stats.limits).toBe(1);
    // The next check runs on a new thread.
    expect(await evaluateMath(math, '\\frac{1}{2}', '0.5')).toMatchObject({ reward: 1, report: { comparison: 'rounded' } });
    expect(threads.threadIds()).not.toContain(first);

    const stem = createStemEnvironment({ toolRegistry, checkPool: threads });
    const instance = stem.validate({ question: 'q', choices: ['1/2', '3'], answer: 'A' });
    const choice = await within(
      stem.evaluate({ instance, sandbox: new FakeSandbox(), signal: new AbortController().signal, outcome: { messages: [], finishAnswer: 'SPIN-FOREVER', finishReason: 'finish_tool' } }),
      100_000,
      'the stuck STEM check ended',
    );
    expect(choice).toMatchObject({ reward: 0, report: { checker_limit: 'no verdict within 300 ms of CPU time' } });
  }, 240_000);

  it('fail a check whose thread dies, or cannot start, as environment_error, never reward 0', async () => {
    const threads = pool({ size: 1, script: FAULTY });
    const math = createMathEnvironment({ toolRegistry, checkPool: threads });
    await expect(within(evaluateMath(math, 'EXIT-THE-CHECKER', '0.5'), 30_000, 'the crash reported')).rejects.toMatchObject({
      code: 'environment_error',
      message: expect.stringMatching(/checker thread exited with code 7/),
    });
    expect(await evaluateMath(math, '\\frac{1}{2}', '0.5')).toMatchObject({ reward: 1 }); // replaced

    // Blocked without using CPU (as a thread starved of a core): not the answer's doing, so no reward at all.
    const blocked = pool({ size: 1, checkCpuMs: 300, starvedAfterMs: 1_000, script: FAULTY });
    const waiting = createMathEnvironment({ toolRegistry, checkPool: blocked });
    await expect(within(evaluateMath(waiting, 'BLOCK-FOREVER', '0.5'), 60_000, 'the blocked check reported')).rejects.toMatchObject({
      code: 'environment_error',
      message: expect.stringMatching(/starved or blocked/),
    });
    expect(blocked.stats.limits).toBe(0);

    // A thread that dies before it is ready (as one out of memory while loading): the token pool's double serves.
    const broken = pool({ size: 1, script: new URL('../support/dies-while-loading-worker.mjs', import.meta.url) });
    const stem = createStemEnvironment({ toolRegistry, checkPool: broken });
    const instance = stem.validate({ question: 'q', answer: '9.8 m/s^2' });
    const failed = within(
      stem.evaluate({ instance, sandbox: new FakeSandbox(), signal: new AbortController().signal, outcome: { messages: [], finishAnswer: '9.8 m/s^2', finishReason: 'finish_tool' } }),
      30_000,
      'the failed start reported',
    );
    await expect(failed).rejects.toBeInstanceOf(RolloutError);
    await expect(failed).rejects.toMatchObject({ code: 'environment_error', message: expect.stringMatching(/could not start/) });
  }, 60_000);
});

describe('a server', () => {
  it('checks its math answers on its own checker threads and closes them when it stops', async () => {
    const hostile = hostileSet(0);
    const h = await startServerHarness({ engine: { policy: () => `So it is \\boxed{${hostile}}` } });
    const threads = h.server.checkPool!;
    try {
      const session = h.client.openSession();
      await session.submit({
        taskId: 'hostile',
        environment: 'math',
        numSamples: 1,
        instance: { problem: 'p', answer: hostileSet(1) },
        sampling: { temperature: 1, seed: 1, maxTokensPerTurn: 1024, maxTotalTokens: 4096, stop: [] },
      });
      session.close();
      const [t] = await within(collect(session.trajectories()), 60_000, 'the trajectory');
      expect(t!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
      expect(t!.reward).toBe(0);
      expect(threads.stats.threaded).toBe(1);
      expect(threads.threadIds().length).toBeGreaterThan(0);
    } finally {
      await h.close();
    }
    expect(threads.threadIds()).toEqual([]);
    await expect(threads.check({ kind: 'equivalence', predicted: '1/2', reference: '0.5' })).rejects.toMatchObject({ code: 'environment_error' });
  }, 120_000);
});
