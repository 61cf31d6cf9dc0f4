import { spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { asyncBufferFromFile, parquetReadObjects } from 'hyparquet';
import { parquetWriteBuffer } from 'hyparquet-writer';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeMathProblem } from '../../src/testing/arithmetic.js';
import { createScriptedMathPolicy } from '../../src/testing/scripted-policy.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

function rollout(args: string[]): { child: ChildProcess; output: () => string; exited: Promise<number | null> } {
  const child = spawn(process.execPath, ['bin/rollout.js', ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' } });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  return { child, output: () => out, exited };
}

async function until(condition: () => boolean, ms: number, what: string): Promise<void> {
  const deadline = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

interface Line {
  taskId: string;
  sampleIndex?: number;
  status: string;
  reward?: number;
  metadata?: Record<string, string>;
}

/** The output's records; throws on a line that does not parse (a torn line). */
function records(path: string): Line[] {
  return readFileSync(path, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Line);
}

const key = (r: { taskId: string; sampleIndex?: number }): string => `${r.taskId}#${r.sampleIndex ?? 0}`;

/** Rows a dataset would hold: arithmetic word problems the fake engine's scripted agent solves. */
function mathRows(n: number, seed: number): Array<{ problem: string; answer: string }> {
  return Array.from({ length: n }, (_, i) => {
    const p = makeMathProblem(seed + i);
    return { problem: p.question, answer: String(p.answer) };
  });
}

/** A Parquet file in verl's column layout (data_source, prompt as chat messages, ability, reward_model, extra_info). */
function writeVerlParquet(path: string, rows: Array<{ problem: string; answer: string }>): void {
  const string = { type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' } as const;
  const schema = [
    { name: 'root', num_children: 5 },
    { name: 'data_source', ...string },
    { name: 'prompt', repetition_type: 'OPTIONAL', converted_type: 'LIST', num_children: 1 },
    { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
    { name: 'element', repetition_type: 'OPTIONAL', num_children: 2 },
    { name: 'content', ...string },
    { name: 'role', ...string },
    { name: 'ability', ...string },
    { name: 'reward_model', repetition_type: 'OPTIONAL', num_children: 2 },
    { name: 'ground_truth', ...string },
    { name: 'style', ...string },
    { name: 'extra_info', repetition_type: 'OPTIONAL', num_children: 2 },
    { name: 'index', type: 'INT64', repetition_type: 'OPTIONAL' },
    { name: 'split', ...string },
  ];
  const buffer = parquetWriteBuffer({
    schema: schema as Parameters<typeof parquetWriteBuffer>[0]['schema'],
    columnData: [
      { name: 'data_source', data: rows.map(() => 'openai/gsm8k') },
      { name: 'prompt', data: rows.map((r) => [{ content: 'Solve it.', role: 'system' }, { content: r.problem, role: 'user' }]) },
      { name: 'ability', data: rows.map(() => 'math') },
      { name: 'reward_model', data: rows.map((r) => ({ ground_truth: r.answer, style: 'rule' })) },
      { name: 'extra_info', data: rows.map((_, i) => ({ index: BigInt(i), split: 'train' })) },
    ],
  });
  writeFileSync(path, new Uint8Array(buffer));
}

describe('rollout submit --dataset (CLI child process against a real server)', () => {
  let h: ServerHarness;
  let dir: string;
  beforeAll(async () => {
    // A few ms per token keeps a 2-turn trajectory in flight long enough to interrupt a run part-way.
    h = await startServerHarness({ engine: { tokenLatencyMs: 2, policy: createScriptedMathPolicy({ wrongAnswerRate: 0, malformedToolCallRate: 0 }) } });
    dir = mkdtempSync(join(tmpdir(), 'rollout-submit-'));
  });
  afterAll(async () => {
    await h?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('runs a JSONL dataset: every sample written once, with progress, reward and status counts', async () => {
    const dataset = join(dir, 'plain.jsonl');
    writeFileSync(dataset, mathRows(6, 100).map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'plain.out.jsonl');
    const run = rollout(['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--server', h.server.address, '--output', output]);
    expect(await run.exited, run.output()).toBe(0);
    const lines = records(output);
    expect(lines).toHaveLength(12);
    expect(new Set(lines.map(key)).size).toBe(12);
    expect(lines.every((l) => l.status === 'TRAJECTORY_STATUS_COMPLETED' && l.reward === 1)).toBe(true);
    expect(new Set(lines.map((l) => l.metadata?.row_index))).toEqual(new Set(['0', '1', '2', '3', '4', '5']));
    expect(run.output()).toMatch(/\[submit\] 12\/12 trajectories \| reward mean 1\.000 \| COMPLETED 12/);
    expect(run.output()).toContain('6 rows submitted, 0 already complete');

    // The same command again finds everything done and submits nothing.
    const again = rollout(['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--server', h.server.address, '--output', output]);
    expect(await again.exited, again.output()).toBe(0);
    expect(again.output()).toContain('0 rows submitted, 6 already complete');
    expect(records(output)).toHaveLength(12);
  });

  it("runs a Parquet dataset in verl's layout and writes Parquet", async () => {
    const dataset = join(dir, 'verl.parquet');
    writeVerlParquet(dataset, mathRows(5, 200));
    const output = join(dir, 'verl.out.parquet');
    const run = rollout(['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--server', h.server.address, '--output', output]);
    expect(await run.exited, run.output()).toBe(0);
    expect(existsSync(`${output}.partial.jsonl`)).toBe(false);
    const rows = await parquetReadObjects({ file: await asyncBufferFromFile(output) });
    expect(rows).toHaveLength(10);
    expect(new Set(rows.map((r) => `${String(r.task_id)}#${String(r.sample_index)}`)).size).toBe(10);
    for (const r of rows) {
      expect(r.status).toBe('TRAJECTORY_STATUS_COMPLETED');
      expect(r.reward).toBe(1);
      expect((r.response_token_ids as number[]).length).toBe((r.response_mask as number[]).length);
      expect((r.response_logprobs as number[]).length).toBe((r.response_mask as number[]).length);
      const metadata = JSON.parse(r.metadata as string) as Record<string, string>;
      expect(metadata).toMatchObject({ data_source: 'openai/gsm8k', ability: 'math' });
      expect(JSON.parse(metadata.extra_info!)).toMatchObject({ split: 'train' });
    }

    // Run again on the finished output: it is read back (a chunk of rows at a time) and nothing is submitted.
    const again = rollout(['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--server', h.server.address, '--output', output]);
    expect(await again.exited, again.output()).toBe(0);
    expect(again.output()).toContain('0 rows submitted, 5 already complete');
    expect(await parquetReadObjects({ file: await asyncBufferFromFile(output) })).toHaveLength(10);
    expect(existsSync(`${output}.partial.jsonl`)).toBe(false);
  });

  it('resumes after a SIGKILL mid-run: finished rows are not submitted again, every sample is in the output once, a torn line is dropped', async () => {
    const dataset = join(dir, 'killed.jsonl');
    const rows = mathRows(24, 300);
    writeFileSync(dataset, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'killed.out.jsonl');
    const args = ['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--concurrency', '3', '--server', h.server.address, '--output', output];
    const first = rollout(args);
    await until(() => existsSync(output) && records(output).length >= 8, 60_000, 'eight trajectories in the output');
    first.child.kill('SIGKILL');
    await first.exited;
    // A crash while writing leaves half a line: the next run must cut it off, not choke on it.
    appendFileSync(output, '{"taskId":"ds-torn","sampleIn');
    const before = readFileSync(output, 'utf8').split('\n').slice(0, -1).map((l) => JSON.parse(l) as Line);
    const perTask = new Map<string, number>();
    for (const l of before) perTask.set(l.taskId, (perTask.get(l.taskId) ?? 0) + 1);
    const complete = [...perTask.values()].filter((n) => n === 2).length;
    expect(complete).toBeGreaterThan(0);
    expect(complete).toBeLessThan(24);

    const second = rollout(args);
    expect(await second.exited, second.output()).toBe(0);
    expect(second.output()).toContain(`${24 - complete} rows submitted, ${complete} already complete`);
    const lines = records(output); // throws if the torn line survived
    expect(lines).toHaveLength(48);
    expect(new Set(lines.map(key)).size).toBe(48);
    expect(lines.every((l) => l.status === 'TRAJECTORY_STATUS_COMPLETED')).toBe(true);
  });

  it('ends cleanly on SIGINT (exit 130, no torn line) and a re-run finishes the dataset', async () => {
    const dataset = join(dir, 'interrupted.jsonl');
    writeFileSync(dataset, mathRows(16, 400).map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'interrupted.out.jsonl');
    const args = ['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--concurrency', '2', '--server', h.server.address, '--output', output];
    const first = rollout(args);
    await until(() => existsSync(output) && records(output).length >= 4, 60_000, 'four trajectories in the output');
    first.child.kill('SIGINT');
    expect(await first.exited, first.output()).toBe(130);
    expect(first.output()).toContain('run the same command again to resume');
    expect(readFileSync(output, 'utf8').endsWith('\n')).toBe(true);
    records(output);

    const second = rollout(args);
    expect(await second.exited, second.output()).toBe(0);
    const lines = records(output);
    expect(lines).toHaveLength(32);
    expect(new Set(lines.map(key)).size).toBe(32);
  });

  it('reports a row the environment rejects, naming the field, runs the others and exits 1', async () => {
    const dataset = join(dir, 'bad.jsonl');
    const [good] = mathRows(1, 500);
    writeFileSync(dataset, `${JSON.stringify(good)}\n${JSON.stringify({ problem: 'no answer here' })}\n`);
    const output = join(dir, 'bad.out.jsonl');
    const run = rollout(['submit', '--dataset', dataset, '--environment', 'math', '--server', h.server.address, '--output', output]);
    expect(await run.exited, run.output()).toBe(1);
    expect(run.output()).toMatch(/row 1 \(ds-[0-9a-f]+-1-[0-9a-f]+\) rejected: instance\.answer/);
    // The server's reason names the field already: said once, not "instance.answer: instance.answer: ...".
    expect(run.output()).not.toContain('instance.answer: instance.answer');
    expect(records(output)).toHaveLength(1);
  });

  it('a dataset with a BOM, CRLF line ends, a line that is not JSON and a row that is not an object: names file:line of each, runs the rest, exits 1; the fixed file resumes with the same ids', async () => {
    const dataset = join(dir, 'messy.jsonl');
    const rows = mathRows(3, 700).map((r) => JSON.stringify(r));
    writeFileSync(dataset, `\uFEFF${rows[0]}\r\n{"problem": "torn\r\n[1, 2]\r\n\r\n${rows[1]}\r\n${rows[2]}\r\n`);
    const output = join(dir, 'messy.out.jsonl');
    const args = ['submit', '--dataset', dataset, '--environment', 'math', '--server', h.server.address, '--output', output];
    const run = rollout(args);
    expect(await run.exited, run.output()).toBe(1);
    expect(run.output()).not.toMatch(/\n\s+at .*\.(ts|js):\d+/);
    expect(run.output()).toContain(`row 1 skipped: ${dataset}:2: not JSON`);
    expect(run.output()).toContain(`row 2 skipped: ${dataset}:3: a row must be a JSON object`);
    expect(run.output()).toContain('3 rows submitted, 0 already complete, 2 rejected or unmappable');
    expect(records(output).map((l) => l.metadata?.row_index).sort()).toEqual(['0', '3', '4']);

    // Fixed in place (blank line kept): the rows that ran keep their index, so their ids, and are not run again.
    const fixed = mathRows(2, 710).map((r) => JSON.stringify(r));
    writeFileSync(dataset, `\uFEFF${rows[0]}\r\n${fixed[0]}\r\n${fixed[1]}\r\n\r\n${rows[1]}\r\n${rows[2]}\r\n`);
    const again = rollout(args);
    expect(await again.exited, again.output()).toBe(0);
    expect(again.output()).toContain('2 rows submitted, 3 already complete, 0 rejected');
    expect(records(output)).toHaveLength(5);
  });

  it('refuses a second run writing the same output while the first is alive, naming its pid; a SIGKILLed run\'s lock is taken over', async () => {
    const dataset = join(dir, 'twice.jsonl');
    writeFileSync(dataset, mathRows(12, 800).map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'twice.out.jsonl');
    const args = ['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--concurrency', '1', '--server', h.server.address, '--output', output];
    const first = rollout(args);
    await until(() => existsSync(output) && records(output).length >= 1, 60_000, 'a trajectory in the output');
    const second = rollout(args);
    expect(await second.exited, second.output()).toBe(2);
    expect(second.output()).toContain(`rollout: --output ${output}: another rollout submit (pid ${first.child.pid}) is writing it; wait for it or stop it`);
    first.child.kill('SIGKILL');
    await first.exited;

    const third = rollout(args);
    expect(await third.exited, third.output()).toBe(0);
    const lines = records(output);
    expect(lines).toHaveLength(24);
    expect(new Set(lines.map(key)).size).toBe(24);
    expect(existsSync(`${output}.lock`)).toBe(false);
  });

  it('takes the instance from --instance-field and rejects a missing dataset with a message', async () => {
    const dataset = join(dir, 'field.jsonl');
    const [row] = mathRows(1, 600);
    writeFileSync(dataset, `${JSON.stringify({ id: 'q1', instance: JSON.stringify(row) })}\n`);
    const output = join(dir, 'field.out.jsonl');
    const run = rollout(['submit', '--dataset', dataset, '--environment', 'math', '--instance-field', 'instance', '--server', h.server.address, '--output', output]);
    expect(await run.exited, run.output()).toBe(0);
    expect(records(output).map((l) => l.reward)).toEqual([1]);

    const missing = rollout(['submit', '--dataset', join(dir, 'nope.jsonl'), '--environment', 'math', '--server', h.server.address]);
    expect(await missing.exited).toBe(2);
    expect(missing.output()).toContain('does not exist');
  });
});
