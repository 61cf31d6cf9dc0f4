import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { taskIdFor } from '../../src/cli/submit-dataset.js';
import { runRollout } from '../support/rollout-process.js';

/**
 * A re-run on an output must not mix two runs that submit a row differently: an edited dataset (the old group of an
 * edited row would stay beside the new one: two groups of one row) or other options (--temperature is not part of
 * what a row is, yet samples of two temperatures in one file are two experiments). The runner refuses it (exit 2)
 * before anything is submitted, and leaves the output as it was; a resume with the same dataset and options is not
 * refused.
 */

const rollout = runRollout;

describe('rollout submit on an output of a run with another dataset or options (review s44)', () => {
  let dir: string;
  /** A port nothing listens on: a run that gets past the check fails to connect (exit 3), having submitted nothing. */
  let deadServer: string;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rollout-review-s44-'));
    const s = createServer();
    await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
    deadServer = `127.0.0.1:${(s.address() as { port: number }).port}`;
    await new Promise<void>((resolve) => s.close(() => resolve()));
  });
  afterAll(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const rows = [
    { problem: '1+1', answer: '2' },
    { problem: '2+2', answer: '4' },
  ];
  /** An output a first run (no sampling flags) left with row 0's whole group. */
  function setUp(name: string): { dataset: string; output: string; before: string } {
    const dataset = join(dir, `${name}.jsonl`);
    writeFileSync(dataset, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, `${name}.out.jsonl`);
    const id = taskIdFor(dataset, 0, 'math', rows[0]!, 1);
    const before = `${JSON.stringify({ taskId: id, groupId: id, environment: 'math', status: 'TRAJECTORY_STATUS_COMPLETED', reward: 1, metadata: { row_index: '0', attempt: '1' } })}\n`;
    writeFileSync(output, before);
    return { dataset, output, before };
  }
  const args = (dataset: string, output: string, ...more: string[]): string[] => ['submit', '--dataset', dataset, '--environment', 'math', '--server', deadServer, '--output', output, '--connect-timeout-ms', '3000', ...more];

  it('refuses a re-run with another --temperature, naming the row and the flag; the same options resume', async () => {
    const { dataset, output, before } = setUp('temp');
    const changed = await rollout(args(dataset, output, '--temperature', '0.5'));
    expect(changed.code, changed.output).toBe(2);
    expect(changed.output).toMatch(/row 0 \(the output has ds-/);
    expect(changed.output).toContain('--temperature');
    expect(readFileSync(output, 'utf8')).toBe(before);
    // The control: the same command as the first run gets past the check (and then finds no server: exit 3).
    const same = await rollout(args(dataset, output));
    expect(same.code, same.output).toBe(3);
    expect(same.output).not.toContain('would submit differently');
    // Its summary says what the reward mean is over (this run's scored trajectories: none here).
    expect(same.output).toContain('reward mean - over the 0 COMPLETED or TRUNCATED trajectories of this run (other statuses have no reward and are not averaged in)');
    expect(readFileSync(output, 'utf8')).toBe(before);
  });

  it('says so when it cuts off a torn last line a killed run left, instead of truncating silently', async () => {
    const { dataset, output, before } = setUp('torn');
    const torn = '{"taskId":"ds-tor';
    writeFileSync(output, `${before}${torn}`);
    const run = await rollout(args(dataset, output));
    expect(run.code, run.output).toBe(3); // no server: nothing more
    expect(run.output).toContain(`${output}: cut off a torn last line (${torn.length} bytes: a run killed mid-write)`);
    expect(readFileSync(output, 'utf8')).toBe(before);
  });

  it('refuses a re-run after a row of the dataset was edited, or the dataset lost rows', async () => {
    const { dataset, output, before } = setUp('edit');
    writeFileSync(dataset, [{ problem: '1+1', answer: '3' }, rows[1]].map((r) => JSON.stringify(r)).join('\n') + '\n');
    const edited = await rollout(args(dataset, output));
    expect(edited.code, edited.output).toBe(2);
    expect(edited.output).toMatch(/row 0 \(the output has ds-\S+, this run makes it ds-/);
    expect(readFileSync(output, 'utf8')).toBe(before);
    writeFileSync(dataset, '');
    const shortened = await rollout(args(dataset, output));
    expect(shortened.code, shortened.output).toBe(2);
    expect(shortened.output).toContain('the dataset has 0 rows');
  });
});
