import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { InjectedFailure } from '../../src/testing/fake-vllm.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

/**
 * A hostile engine's answers, through a real server and a fake vLLM over real HTTP (test double): each is refused as an
 * engine fault — the trajectory ends BACKEND_ERROR naming what was wrong, with no token of the answer in it (no mask 1)
 * — and the server goes on serving. An answer meant for another request is asked again instead (review-s38
 * misdelivery): the trajectory completes from the retry's answer.
 */

const describeT = (t: Trajectory): string => `${TrajectoryStatus[t.status]} ${t.finishReason} ${t.error}`;
type Choice = Record<string, unknown> & { logprobs: { tokens: string[]; token_logprobs: number[] } };
const tamper = (change: (choice: Choice, answer: Record<string, unknown>) => void): InjectedFailure => ({
  kind: 'tamper',
  tamper: (choice, answer) => change(choice as Choice, answer),
});
/** A raw completion body whose first logprob is written as `logprob` (JSON numbers JSON.stringify cannot write). */
const rawLogprob = (logprob: string): InjectedFailure => ({
  kind: 'garbage',
  body: `{"id":"cmpl-x","object":"text_completion","model":"m","choices":[{"index":0,"text":"4","finish_reason":"stop","logprobs":{"tokens":["token_id:19"],"token_logprobs":[${logprob}]}}]}`,
});

const attacks: Array<[string, InjectedFailure, RegExp]> = [
  ['a token id past the vocabulary', tamper((c) => (c.logprobs.tokens[0] = 'token_id:151669')), /logprobs\.tokens\[0\] \(token_id\) = 151669 is not an integer in \[0, 151669\)/],
  ['a token id of 17 digits (past 2^53)', tamper((c) => (c.logprobs.tokens[0] = 'token_id:90071992547409931')), /logprobs\.tokens\[0\] = "token_id:90071992547409931" is not "token_id:<id>"/],
  ['a logprob of +Infinity (1e999 in JSON)', rawLogprob('1e999'), /token_logprobs\[0\] = Infinity is not a finite number/],
  ['a logprob of -Infinity (-1e999 in JSON)', rawLogprob('-1e999'), /token_logprobs\[0\] = -Infinity is not a finite number/],
  ['a NaN logprob (not JSON at all)', rawLogprob('NaN'), /body is not JSON/],
  ['a positive logprob', tamper((c) => (c.logprobs.token_logprobs[0] = 0.5)), /token_logprobs\[0\] = 0\.5 is positive/],
  ['an unknown finish_reason', tamper((c) => (c.finish_reason = 'tool_calls')), /unexpected finish_reason "tool_calls"/],
  ['a finish_reason that is an object', tamper((c) => (c.finish_reason = { type: 'stop' })), /unexpected finish_reason an object/],
  ['one logprob fewer than token ids', tamper((c) => void c.logprobs.token_logprobs.pop()), /(\d+) token ids but \d+ logprobs/],
  ['one token id fewer than logprobs', tamper((c) => void c.logprobs.tokens.pop()), /(\d+) token ids but \d+ logprobs/],
  ['an enormous usage.completion_tokens', tamper((_c, a) => ((a.usage as Record<string, unknown>).completion_tokens = 1e308)), /usage\.completion_tokens = 1e\+308, but the answer holds/],
  ['an enormous usage object (megabytes)', tamper((_c, a) => ((a.usage as Record<string, unknown>).padding = 'x'.repeat(8 << 20))), /larger than the \d+-byte cap/],
];

describe('a hostile engine answer, through the server', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness();
  });
  afterAll(async () => h?.close());

  const run = async (taskId: string, seed: number): Promise<Trajectory> => {
    const session = h.client.openSession();
    await session.submit(mathTask(taskId, 1, seed));
    session.close();
    const [t] = await collect(session.trajectories());
    return t!;
  };

  it.each(attacks)('%s ends the trajectory BACKEND_ERROR, saying why, with none of its tokens', async (name, fault, refusal) => {
    const before = h.engine.stats().received;
    h.engine.failNext(1, fault);
    const i = attacks.findIndex(([n]) => n === name);
    const t = await run(`attack-${i}`, 7310 + i);
    expect(TrajectoryStatus[t.status], describeT(t)).toBe('TRAJECTORY_STATUS_BACKEND_ERROR');
    expect(t.error).toMatch(refusal);
    expect(t.responseMask.filter((m) => m === 1)).toEqual([]);
    expect(invariantViolations(t)).toEqual([]);
    // Refused once, not retried: a malformed answer is not a transport fault.
    expect(h.engine.stats().received).toBe(before + 1);
  });

  it('an answer meant for another request (usage.prompt_tokens not ours, however large) is asked again and the trajectory completes', async () => {
    const pool = h.server.runtime.deps.pool;
    const counted = (): number => pool.list().reduce((n, b) => n + b.misdeliveredAnswers, 0);
    const before = h.engine.stats().received;
    const misdelivered = counted();
    h.engine.failNext(1, tamper((c, a) => {
      (a.usage as Record<string, unknown>).prompt_tokens = 1e308;
      c.logprobs.tokens = c.logprobs.tokens.map(() => 'token_id:0'); // tokens that must not reach the trajectory
    }));
    const t = await run('attack-misdelivered', 7302);
    expect(TrajectoryStatus[t.status], describeT(t)).toBe('TRAJECTORY_STATUS_COMPLETED');
    expect(t.responseTokenIds.length).toBeGreaterThan(0);
    expect(t.responseTokenIds.every((id) => id === 0)).toBe(false);
    expect(invariantViolations(t)).toEqual([]);
    expect(h.engine.stats().received).toBeGreaterThanOrEqual(before + 2);
    expect(counted()).toBe(misdelivered + 1);
  });

  it('leaves the server serving: a clean task completes after them all', async () => {
    const t = await run('after-the-attacks', 7303);
    expect(TrajectoryStatus[t.status], describeT(t)).toBe('TRAJECTORY_STATUS_COMPLETED');
    expect(invariantViolations(t)).toEqual([]);
  });
});
