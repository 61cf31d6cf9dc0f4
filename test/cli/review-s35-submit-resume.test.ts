import { spawn } from 'node:child_process';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { taskIdFor } from '../../src/cli/submit-dataset.js';
import { makeMathProblem } from '../../src/testing/arithmetic.js';
import { createScriptedMathPolicy } from '../../src/testing/scripted-policy.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

/**
 * Runs `bin/rollout.js` to its end (stdout and stderr together). `fileSizeLimitKb` runs it under `ulimit -f`: past that
 * size a write fails (EFBIG; Node ignores SIGXFSZ), the way a full disk fails it with ENOSPC.
 */
async function rollout(args: string[], fileSizeLimitKb?: number, onOutput?: (text: string) => void): Promise<{ code: number | null; output: string }> {
  const command = fileSizeLimitKb === undefined ? [process.execPath, ['bin/rollout.js', ...args]] : ['/bin/sh', ['-c', `ulimit -f ${fileSizeLimitKb} && exec "$0" "$@"`, process.execPath, 'bin/rollout.js', ...args]];
  const child = spawn(command[0] as string, command[1] as string[], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' } });
  let output = '';
  child.stdout.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr.on('data', (d: Buffer) => {
    output += d.toString();
    onOutput?.(output);
  });
  const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
  return { code, output };
}

interface Line {
  taskId: string;
  sampleIndex?: number;
  status: string;
  reward?: number;
  metadata?: Record<string, string>;
}

function records(path: string): Line[] {
  return readFileSync(path, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Line);
}

function mathRows(n: number, seed: number): Array<{ problem: string; answer: string }> {
  return Array.from({ length: n }, (_, i) => {
    const p = makeMathProblem(seed + i);
    return { problem: p.question, answer: String(p.answer) };
  });
}

/** A TCP proxy in front of the server whose connections can be cut at once (a server host that vanishes). */
async function startCuttableProxy(target: string): Promise<{ address: string; cut: () => void; close: () => Promise<void> }> {
  const [host, port] = [target.slice(0, target.lastIndexOf(':')), Number(target.slice(target.lastIndexOf(':') + 1))];
  const sockets = new Set<Socket>();
  let cutOff = false;
  const server: Server = createServer((client) => {
    if (cutOff) return void client.destroy();
    const upstream = createConnection({ host, port });
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => undefined);
    }
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port: own } = server.address() as { port: number };
  return {
    address: `127.0.0.1:${own}`,
    cut: () => {
      cutOff = true;
      for (const s of sockets) s.resetAndDestroy();
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

describe('rollout submit resuming on an output a crash left behind', () => {
  let h: ServerHarness;
  let dir: string;
  beforeAll(async () => {
    h = await startServerHarness({ engine: { tokenLatencyMs: 1, policy: createScriptedMathPolicy({ wrongAnswerRate: 0, malformedToolCallRate: 0 }) } });
    dir = mkdtempSync(join(tmpdir(), 'rollout-review-s35-'));
  });
  afterAll(async () => {
    await h?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('a group half written by a killed run, on a server that forgot the task, is replaced whole: never samples of two runs in one group', async () => {
    const dataset = join(dir, 'half.jsonl');
    const data = mathRows(2, 3500);
    writeFileSync(dataset, data.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'half.out.jsonl');
    // What a run SIGKILLed (or out of disk) while writing row 0's group leaves: its sample 0, from a run this server
    // never saw (another server, or one restarted without its journal), so the task is run again from scratch.
    const task0 = taskIdFor(dataset, 0, 'math', data[0]!, 2);
    const oldSample = { taskId: task0, groupId: task0, environment: 'math', status: 'TRAJECTORY_STATUS_COMPLETED', reward: 0.25, metadata: { row_index: '0', attempt: '1', run: 'killed' } };
    writeFileSync(output, `${JSON.stringify(oldSample)}\n`);

    const run = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--server', h.server.address, '--output', output]);
    expect(run.code, run.output).toBe(0);
    const lines = records(output);
    const group0 = lines.filter((l) => l.taskId === task0);
    expect(group0.map((l) => l.sampleIndex ?? 0).sort()).toEqual([0, 1]);
    // Both samples of the group come from the one run that made it whole.
    expect(group0.filter((l) => l.metadata?.run === 'killed')).toEqual([]);
    expect(group0.every((l) => l.reward === 1)).toBe(true);
    expect(lines).toHaveLength(4);
  });

  it('a write that fails (disk full) stops the run with a non-zero exit naming the output, never "done"; a re-run finishes it', async () => {
    const dataset = join(dir, 'full.jsonl');
    writeFileSync(dataset, mathRows(40, 3600).map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'full.out.jsonl');
    const args = ['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--concurrency', '4', '--server', h.server.address, '--output', output];
    // 64 KB holds a few trajectories (a line is several KB), far from all 80.
    const full = await rollout(args, 64);
    expect(full.code, full.output).not.toBe(0);
    expect(full.code, full.output).not.toBe(1);
    expect(full.output).toMatch(/cannot write .*full\.out\.jsonl/);
    expect(full.output).not.toMatch(/\[submit\] done/);
    expect(full.output).not.toMatch(/\n\s+at .*\.(ts|js):\d+/);
    expect(existsSync(`${output}.lock`)).toBe(false);
    const kept = records(output); // no torn line
    expect(kept.length).toBeGreaterThan(0);
    expect(kept.length).toBeLessThan(80);

    const again = await rollout(args);
    expect(again.code, again.output).toBe(0);
    const lines = records(output);
    expect(lines).toHaveLength(80);
    expect(new Set(lines.map((l) => `${l.taskId}#${l.sampleIndex ?? 0}`)).size).toBe(80);
    const perTask = new Map<string, number>();
    for (const l of lines) perTask.set(l.taskId, (perTask.get(l.taskId) ?? 0) + 1);
    expect([...perTask.values()].every((n) => n === 2)).toBe(true);
  }, 120_000);

  it('a server that goes away mid-run (connections reset): the run ends with exit 3 and a message, rows in flight are not blamed on the data', async () => {
    const dataset = join(dir, 'gone.jsonl');
    writeFileSync(dataset, mathRows(60, 3700).map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'gone.out.jsonl');
    const proxy = await startCuttableProxy(h.server.address);
    try {
      let cut = false;
      const gone = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--concurrency', '4', '--server', proxy.address, '--output', output], undefined, (text) => {
        if (!cut && /\[submit\] [1-9][0-9]*\/120 trajectories/.test(text)) {
          cut = true;
          proxy.cut();
        }
      });
      expect(cut).toBe(true);
      expect(gone.code, gone.output).toBe(3);
      expect(gone.output).toMatch(/the stream to .* failed/);
      expect(gone.output).toContain('0 rejected or unmappable');
      expect(gone.output).not.toMatch(/rejected: /);
      expect(gone.output).toMatch(/\[submit\] stopped: /);
    } finally {
      await proxy.close();
    }
    const again = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--concurrency', '4', '--server', h.server.address, '--output', output]);
    expect(again.code, again.output).toBe(0);
    expect(records(output)).toHaveLength(120);
  }, 120_000);

  it('a Parquet output a rejected row keeps from being written says so, and names an earlier run\'s file as lacking this run\'s rows', async () => {
    const dataset = join(dir, 'pq.jsonl');
    const data = mathRows(3, 3800).map((r) => JSON.stringify(r));
    writeFileSync(dataset, `${data[0]}\n${data[1]}\n`);
    const output = join(dir, 'pq.out.parquet');
    const args = ['submit', '--dataset', dataset, '--environment', 'math', '--server', h.server.address, '--output', output];
    const first = await rollout(args);
    expect(first.code, first.output).toBe(0);
    expect(existsSync(output)).toBe(true);
    expect(first.output).not.toContain('not written');

    // The dataset grows by a row and a line that is not JSON: the new row runs, the Parquet file cannot be written.
    writeFileSync(dataset, `${data[0]}\n${data[1]}\n${data[2]}\n{"problem": \n`);
    const second = await rollout(args);
    expect(second.code, second.output).toBe(1);
    expect(second.output).toContain(`${output} not written (1 rows were rejected or could not be read: fix them and run again): the trajectories are in ${output}.partial.jsonl; ${output} is an earlier run's and lacks them`);
    expect(records(`${output}.partial.jsonl`)).toHaveLength(3);
  });

  it('a damaged line with trajectories after it is refused naming the line, never cut off with them; a damaged tail is cut off', async () => {
    const dataset = join(dir, 'damaged.jsonl');
    const data = mathRows(3, 3900);
    writeFileSync(dataset, data.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const line = (i: number): string => {
      const taskId = taskIdFor(dataset, i, 'math', data[i]!, 1);
      return JSON.stringify({ taskId, groupId: taskId, environment: 'math', status: 'TRAJECTORY_STATUS_COMPLETED', reward: 1, metadata: { row_index: String(i), attempt: '1' } });
    };
    const output = join(dir, 'damaged.out.jsonl');
    const damaged = `${line(0)}\n{"taskId":"ds-x","sampl\x00\x00\n${line(1)}\n`;
    writeFileSync(output, damaged);
    const args = ['submit', '--dataset', dataset, '--environment', 'math', '--server', h.server.address, '--output', output];
    const refused = await rollout(args);
    expect(refused.code, refused.output).toBe(2);
    expect(refused.output).toContain(`--output ${output}: line 2 is not a trajectory (not JSON) and trajectories follow it (line 3)`);
    expect(readFileSync(output, 'utf8')).toBe(damaged); // row 1's sample is still there
    expect(existsSync(`${output}.lock`)).toBe(false);

    // Zeros a power loss left after the last whole line: a tail, cut off; rows 1 and 2 run.
    writeFileSync(output, `${line(0)}\n\x00\x00\x00\x00\n`);
    const resumed = await rollout(args);
    expect(resumed.code, resumed.output).toBe(0);
    expect(resumed.output).toContain('2 rows submitted, 1 already complete');
    expect(records(output)).toHaveLength(3);
  });
});
