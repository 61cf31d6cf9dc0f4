import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeMathProblem } from '../../src/testing/arithmetic.js';
import { createScriptedMathPolicy } from '../../src/testing/scripted-policy.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { runRollout } from '../support/rollout-process.js';

/**
 * A JSONL row that cannot be mapped or that the server rejects is reported with its file and line, as a line that is
 * not JSON is: the row index alone counts rows, not lines (blank lines are not rows), so "row 1" of a file with a blank
 * line is on line 3, and the user must count to find it.
 */

const rollout = runRollout;

describe('rollout submit names the file and line of a bad JSONL row (review s44)', () => {
  let h: ServerHarness;
  let dir: string;
  beforeAll(async () => {
    h = await startServerHarness({ engine: { tokenLatencyMs: 1, policy: createScriptedMathPolicy({ wrongAnswerRate: 0, malformedToolCallRate: 0 }) } });
    dir = mkdtempSync(join(tmpdir(), 'rollout-review-s44-lines-'));
  });
  afterAll(async () => {
    await h?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('an unmappable row and a rejected row are reported as FILE:LINE; the good row runs; exit 1', async () => {
    const p = makeMathProblem(4400);
    const dataset = join(dir, 'rows.jsonl');
    const verlNoTruth = { prompt: [{ role: 'user', content: 'What is 1+1?' }], reward_model: { ground_truth: null, style: 'rule' } };
    writeFileSync(dataset, `${JSON.stringify({ problem: p.question, answer: String(p.answer) })}\n\n${JSON.stringify(verlNoTruth)}\n${JSON.stringify({ problem: 'no answer' })}\n`);
    const output = join(dir, 'rows.out.jsonl');
    const run = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--server', h.server.address, '--output', output]);
    expect(run.code, run.output).toBe(1);
    expect(run.output).toContain(`[submit] ${dataset}:3: row 1 skipped: row 1: reward_model.ground_truth is null`);
    const rejected = run.output.split('\n').find((l) => l.includes(') rejected: '));
    expect(rejected).toMatch(/^\[submit\] (.+):4: row 2 \(ds-[0-9a-f]+-2-[0-9a-f]+\) rejected: instance\.answer/);
    expect(rejected!.startsWith(`[submit] ${dataset}:4: `)).toBe(true);
    expect(readFileSync(output, 'utf8').trim().split('\n')).toHaveLength(1);
  });
});
