import { existsSync } from 'node:fs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../../src/errors.js';
import { createMathEnvironment } from '../../../src/environments/math/math-environment.js';
import { findMathVerify, mathVerifyMounts, runMathVerify, type MathVerifyPair } from '../../../src/environments/math/math-verify-checker.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import { defaultImagePath } from '../../../src/sandboxes/images/image-recipe.js';
import type { OpenSandbox } from '../../../src/environments/types.js';
import type { SandboxRequest } from '../../../src/sandboxes/spec.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { ToolRegistry } from '../../../src/tools/registry.js';
import type { Tool } from '../../../src/tools/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';
import { FakeSandbox } from '../fake-sandbox.js';

const installation = findMathVerify();
const image = existsSync(defaultImagePath()) ? defaultImagePath() : undefined;

/**
 * Cases from math-verify's own README and tests (tests/test_all.py: compare_strings, i.e. both sides parsed with
 * LaTeX extraction, \boxed first, plus plain-expression extraction), with the verdict its documentation gives.
 * They run through the `raw` mode of python/math-verify/check_answers.py in a real sandbox: proof that what the
 * math environment runs is math-verify behaving as documented, not a look-alike.
 */
const DOCUMENTED: ReadonlyArray<readonly [string, string, boolean, string]> = [
  ['${1,3} \\cup {2,4}$', '${1,2,3,4}$', true, 'README: set union'],
  ['-5', '-5', true, 'negative numbers'],
  ['7425000', '7,425,000', true, 'thousands separator'],
  ['1000', '1 000', true, 'space as thousands separator'],
  ['1000', '1000.0', true, 'decimal of an integer'],
  ['0.4', '.4', true, 'no leading zero'],
  ['1000.99', '$1,000.99', true, 'currency sign'],
  ['2', 'AZYUK2A', false, 'a digit inside a word is no answer'],
  ['10/9', '\\frac{10}{9}', true, 'simple fraction notation'],
  ['-10/9', '-\\frac{10}{9}', true, 'negative fraction'],
  ['$[0,1)$', '$[0,1)$', true, 'half-open interval'],
  ['$[0,9)$', '$[0,1)$', false, 'different interval end'],
  ['$(0,9)$', '$[0,9)$', false, 'interval ends matter'],
  ['$9$', 'Answer \\[ 9 \\]', true, 'display math'],
  ['$1/3$', '$\\frac13 $', true, 'malformed \\frac'],
  ['$\\sqrt{3}$', '$\\sqrt3 $', true, 'malformed \\sqrt'],
  ['$1/3$', '$\\dfrac{1}{3} $', true, '\\dfrac'],
  ['$1/3$', '$\\tfrac{1}{3} $', true, '\\tfrac'],
  ['$1/3$', '$\\frac{1}{3} \\text{meters}$', true, 'units in \\text are dropped'],
  ['$1/3$', '$k = \\frac{1}{3}$', true, 'the last = is the answer'],
  ['$28\\%$', '28 percent', true, 'percent as a word'],
  ['$28\\%$', '28', true, 'integer percent equals the integer'],
  ['$0.28$', '28', false, 'a rate is not the percent number'],
  ['$28/100$', '28', false, 'nor is a fraction'],
  ['$\\text{Evelyn}$', 'Therefore, $\\boxed{\\text{Evelyn}}$ is our answer.', true, 'text answer in a box'],
];

const fakeTool = (name: string): Tool => ({ name, description: name, parameters: { type: 'object' }, run: async () => ({ output: '', outcome: 'ok' }) });
const toolRegistry = new ToolRegistry().register('python', () => fakeTool('python')).register('bash', () => fakeTool('bash')).register('finish', () => fakeTool('finish'));

// Installed by scripts/setup.sh (its test section); in CI a missing install fails here instead of skipping.
describe.runIf(installation || process.env.CI)('math-verify checker (the real math-verify, in a bubblewrap sandbox)', () => {
  const driver = closeAfterAll(new BubblewrapDriver());
  let sandbox: Sandbox;
  /** Requests the environment made through openSandbox (the pipeline's seam, played here by the driver itself). */
  const requests: (SandboxRequest | undefined)[] = [];
  const opened: Sandbox[] = [];
  const openSandbox: OpenSandbox = async (request) => {
    requests.push(request);
    const fresh = await driver.start({ ...testSpec({ image, memoryMb: 1024 }), mounts: request?.mounts ?? [] });
    opened.push(fresh);
    return fresh;
  };
  beforeAll(async () => {
    sandbox = await driver.start({ ...testSpec({ image, memoryMb: 1024 }), mounts: mathVerifyMounts(installation!) });
  });
  afterEach(async () => {
    await Promise.all(opened.splice(0).map((s) => s.stop()));
  });
  afterAll(async () => {
    await sandbox?.stop();
    await driver.close?.();
  });

  it("gives math-verify's documented verdicts", async () => {
    const verdicts = await runMathVerify(sandbox, DOCUMENTED.map(([gold, pred]): MathVerifyPair => ({ gold, pred, raw: true })), { timeoutMs: 120_000 });
    const got = DOCUMENTED.map(([gold, pred, , why], i) => ({ gold, pred, why, equivalent: verdicts[i]!.equivalent }));
    expect(got).toEqual(DOCUMENTED.map(([gold, pred, equivalent, why]) => ({ gold, pred, why, equivalent })));
  });

  it('grades a math instance through the environment in a fresh sandbox, reporting what it parsed and the built-in verdict', async () => {
    const math = createMathEnvironment({ toolRegistry, checker: 'math-verify' });
    const instance = math.validate({ problem: 'What is 1/2 + 1/4?', answer: '\\frac{3}{4}' });
    // The episode's sandbox needs nothing of math-verify: only the grading sandbox gets its packages.
    expect(math.sandbox?.(instance).mounts ?? []).toEqual([]);
    const signal = new AbortController().signal;
    const episode = new FakeSandbox();
    requests.length = 0;
    const right = await math.evaluate({ instance, sandbox: episode, signal, openSandbox, outcome: { finishReason: 'answer', messages: [{ role: 'assistant', content: 'So \\boxed{0.75}.' }] } });
    expect(right.reward).toBe(1);
    expect(right.report).toMatchObject({ extracted: '0.75', checker: 'math-verify', comparison: 'math-verify', builtin: true });
    expect(right.report.parsed).toEqual({ gold: ['3/4', '\\frac{3}{4}'], pred: ['0.750000000000000', '0.75'] });
    const wrong = await math.evaluate({ instance, sandbox: episode, signal, openSandbox, outcome: { finishReason: 'answer', messages: [{ role: 'assistant', content: '\\boxed{0.7}' }] } });
    expect(wrong.reward).toBe(0);
    expect(wrong.details).toEqual({ correct: 0, has_answer: 1 });
    expect(requests).toEqual([{ mounts: mathVerifyMounts(installation!) }, { mounts: mathVerifyMounts(installation!) }]);
    expect(episode.calls).toEqual([]); // the episode's sandbox is never touched
  });

  it('an instance can ask for math-verify when the default is built-in, and the other way round', async () => {
    const math = createMathEnvironment({ toolRegistry });
    const mv = math.validate({ problem: 'p', answer: '\\sin^2 x + \\cos^2 x', checker: 'math-verify' });
    const outcome = { finishReason: 'finish_tool', finishAnswer: '1', messages: [] };
    const result = await math.evaluate({ instance: mv, sandbox: new FakeSandbox(), signal: new AbortController().signal, outcome, openSandbox });
    expect(result.report).toMatchObject({ checker: 'math-verify' });
    expect(result.reward).toBe(1);
    requests.length = 0;
    const builtin = await math.evaluate({ instance: math.validate({ problem: 'p', answer: '1' }), sandbox: new FakeSandbox(), signal: new AbortController().signal, outcome, openSandbox });
    expect(builtin.report).toMatchObject({ checker: 'builtin' });
    expect(requests).toEqual([]); // the built-in checker opens no sandbox
  });

  it('an answer that makes sympy work hard is a verdict within the timeouts, not a hang', async () => {
    const [verdict] = await runMathVerify(sandbox, [{ gold: '1', pred: '9^{9^{9^{9}}}' }], { timeoutMs: 60_000 });
    expect(verdict!.equivalent).toBe(false);
  });

  // Found by review (helper-37): math-verify's own timeouts are signal.alarm, which cannot stop sympy inside one long C
  // computation, so this answer kept the checker busy past the whole run's timeout: ENVIRONMENT_ERROR, which trainers
  // drop, for what the model wrote. The check of one answer now has a hard bound of its own, and hitting it is reward 0.
  it('an answer whose check runs past every bound of math-verify is reward 0 with the reason, not an environment error', async () => {
    const math = createMathEnvironment({ toolRegistry, checker: 'math-verify' });
    const instance = math.validate({ problem: 'p', answer: '5' });
    const outcome = { finishReason: 'finish_tool', finishAnswer: '9!!!! + 9!!!! + 9!!!! + 9!!!!', messages: [] };
    const result = await math.evaluate({ instance, sandbox: new FakeSandbox(), signal: new AbortController().signal, outcome, openSandbox });
    expect(result).toMatchObject({ reward: 0, details: { correct: 0, has_answer: 1 }, report: { checker: 'math-verify', checker_limit: expect.stringMatching(/no verdict within \d+ s/) } });
  }, 60_000);

  it('a sandbox without the packages, or no openSandbox at all, is an environment error, never a reward of 0', async () => {
    const bare = await driver.start(testSpec({ image }));
    try {
      const math = createMathEnvironment({ toolRegistry, checker: 'math-verify' });
      const instance = math.validate({ problem: 'p', answer: '1' });
      const outcome = { finishReason: 'answer', messages: [{ role: 'assistant' as const, content: '\\boxed{1}' }] };
      const signal = new AbortController().signal;
      const withoutPackages = await math.evaluate({ instance, sandbox: bare, signal, outcome, openSandbox: async () => bare }).then(() => undefined, (err: unknown) => err);
      expect(withoutPackages).toBeInstanceOf(RolloutError);
      expect((withoutPackages as RolloutError).code).toBe('environment_error');
      expect((withoutPackages as RolloutError).message).toMatch(/^math-verify checker: exited with 2/);
      await expect(math.evaluate({ instance, sandbox: bare, signal, outcome })).rejects.toMatchObject({ code: 'environment_error', message: expect.stringContaining('needs openSandbox') });
    } finally {
      await bare.stop();
    }
  });
});

describe('math-verify checker: configuration', () => {
  it('is refused at start-up when asked for by default but not installed', () => {
    expect(() => createMathEnvironment({ toolRegistry, checker: 'math-verify', ...notInstalled() })).toThrow(/not installed/);
  });

  it('rejects an instance asking for it on a server without it, naming instance.checker', () => {
    const math = createMathEnvironment({ toolRegistry, ...notInstalled() });
    expect(() => math.validate({ problem: 'p', answer: '1', checker: 'math-verify' })).toThrow(expect.objectContaining({ code: 'invalid_argument', field: 'instance.checker' }));
    expect(() => math.validate({ problem: 'p', answer: '1', checker: 'sympy' })).toThrow(expect.objectContaining({ field: 'instance.checker' }));
  });
});

/** Options under which the environment finds no math-verify, whatever this machine has installed. */
function notInstalled(): { mathVerifyVenv: string } {
  return { mathVerifyVenv: '/nonexistent/math-verify' };
}
