import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { asyncBufferFromFile, parquetMetadataAsync } from 'hyparquet';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { taskIdFor } from '../../src/cli/submit-dataset.js';
import { makeMathProblem } from '../../src/testing/arithmetic.js';
import { createScriptedMathPolicy } from '../../src/testing/scripted-policy.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

function rollout(args: string[]): { child: ChildProcess; output: () => string; exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }> } {
  const child = spawn(process.execPath, ['bin/rollout.js', ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' } });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
  return { child, output: () => out, exited };
}

/** Files of `dir` that are someone's temporary file (`*.tmp-<pid>`). */
const temps = (dir: string): string[] => readdirSync(dir).filter((f) => /\.tmp-\d+$/.test(f));

/** Polls until a `*.tmp-<pid>` file is in `dir` (the run is writing its Parquet file), or the child ended. */
async function untilTempFile(dir: string, exited: Promise<unknown>): Promise<boolean> {
  let ended = false;
  void exited.then(() => (ended = true));
  while (!ended) {
    if (temps(dir).length > 0) return true;
    await new Promise((r) => setTimeout(r, 2));
  }
  return false;
}

const ROWS = 240;
const TOKENS = 6000;

/**
 * A dataset of ROWS math rows and the Parquet output's journal holding a whole group of each (as a run that was
 * interrupted after its last trajectory arrived leaves it), each trajectory long: writing the Parquet file from it
 * takes long enough (~100 MB of JSON) to interrupt it.
 */
function finishedRunOnDisk(dir: string, name: string): { dataset: string; output: string } {
  const dataset = join(dir, `${name}.jsonl`);
  const rows = Array.from({ length: ROWS }, (_, i) => {
    const p = makeMathProblem(7000 + i);
    return { problem: p.question, answer: String(p.answer) };
  });
  writeFileSync(dataset, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  const output = join(dir, `${name}.parquet`);
  const ids = Array.from({ length: TOKENS }, (_, i) => 1000 + ((i * 7919) % 150000));
  const body = JSON.stringify({
    environment: 'math',
    status: 'TRAJECTORY_STATUS_COMPLETED',
    promptTokenIds: ids.slice(0, 256),
    responseTokenIds: ids,
    responseMask: ids.map(() => 1),
    responseLogprobs: ids.map((id) => -(id % 1000) / 997),
    reward: 1,
  }).slice(1);
  const fd = openSync(`${output}.partial.jsonl`, 'w');
  for (const [i, row] of rows.entries()) {
    const taskId = taskIdFor(dataset, i, 'math', row, 1);
    writeSync(fd, `{"taskId":"${taskId}","groupId":"${taskId}","metadata":{"row_index":"${i}"},${body}\n`);
  }
  closeSync(fd);
  return { dataset, output };
}

async function parquetRows(path: string): Promise<number> {
  return Number((await parquetMetadataAsync(await asyncBufferFromFile(path))).num_rows);
}

describe('rollout submit interrupted while it writes its Parquet output (CLI child process against a real server)', () => {
  let h: ServerHarness;
  let dir: string;
  beforeAll(async () => {
    h = await startServerHarness({ engine: { policy: createScriptedMathPolicy({ wrongAnswerRate: 0, malformedToolCallRate: 0 }) } });
    dir = mkdtempSync(join(tmpdir(), 'rollout-s37-interrupt-'));
  });
  afterAll(async () => {
    await h?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('SIGINT while the Parquet file is written: the file is finished (every row in it), no temporary file is left behind', async () => {
    const sub = join(dir, 'sigint');
    rmSync(sub, { recursive: true, force: true });
    mkdirSync(sub);
    const { dataset, output } = finishedRunOnDisk(sub, 'ds');
    const run = rollout(['submit', '--dataset', dataset, '--environment', 'math', '--server', h.server.address, '--output', output]);
    const writing = await untilTempFile(sub, run.exited);
    expect(writing, `the run never wrote a temporary file:\n${run.output()}`).toBe(true);
    run.child.kill('SIGINT');
    const { code, signal } = await run.exited;
    // Not killed half-way through the write: the run finishes its output, says it is done and exits 0. (Before, only
    // signal-exit's listener - node-llama-cpp's proper-lockfile installs it when the CLI loads - kept the process alive
    // through the write, then re-raised the signal: it ended by SIGINT, by luck of a dependency.)
    expect(run.output()).toMatch(/\[submit\] done: /);
    expect({ code, signal }, run.output()).toEqual({ code: 0, signal: null });
    expect(temps(sub)).toEqual([]);
    expect(await parquetRows(output)).toBe(ROWS);
    expect(existsSync(`${output}.partial.jsonl`)).toBe(false);
    expect(existsSync(`${output}.partial.jsonl.lock`)).toBe(false);
  }, 180_000);

  it('SIGKILL while the Parquet file is written: the re-run removes the dead run\'s temporary file and finishes the output', async () => {
    const sub = join(dir, 'sigkill');
    rmSync(sub, { recursive: true, force: true });
    mkdirSync(sub);
    const { dataset, output } = finishedRunOnDisk(sub, 'ds');
    const args = ['submit', '--dataset', dataset, '--environment', 'math', '--server', h.server.address, '--output', output];
    const first = rollout(args);
    expect(await untilTempFile(sub, first.exited), first.output()).toBe(true);
    first.child.kill('SIGKILL');
    await first.exited;
    // What a kill -9 (an OOM kill, a node lost) leaves: the journal whole, and a Parquet file half written beside it.
    expect(temps(sub)).toHaveLength(1);
    expect(existsSync(output)).toBe(false);

    const second = rollout(args);
    expect((await second.exited).code, second.output()).toBe(0);
    expect(temps(sub)).toEqual([]);
    expect(await parquetRows(output)).toBe(ROWS);
  }, 180_000);
});
