import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { makeMathProblem } from '../../src/testing/arithmetic.js';
import { createScriptedMathPolicy } from '../../src/testing/scripted-policy.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { runRollout } from '../support/rollout-process.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

const rollout = runRollout;

interface Line {
  taskId: string;
  groupId: string;
  sampleIndex?: number;
  status: string;
  reward?: number;
  error?: string;
  metadata?: Record<string, string>;
}

function records(path: string): Line[] {
  if (!existsSync(path)) return [];
  return readFileSync(path, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Line);
}

/** Rows of distinct arithmetic questions (a question names its row to the engine double below). */
function rows(n: number, seed: number): Array<{ problem: string; answer: string }> {
  const seen = new Set<string>();
  const out: Array<{ problem: string; answer: string }> = [];
  for (let s = seed; out.length < n; s++) {
    const p = makeMathProblem(s);
    if (seen.has(p.question)) continue;
    seen.add(p.question);
    out.push({ problem: p.question, answer: String(p.answer) });
  }
  return out;
}

const byRow = (lines: Line[]): Map<string, Line[]> => {
  const map = new Map<string, Line[]>();
  for (const l of lines) map.set(l.metadata!.row_index!, [...(map.get(l.metadata!.row_index!) ?? []), l]);
  return map;
};

describe('rollout submit --retries: infrastructure failures are retried as new tasks, policy outcomes never', () => {
  let h: ServerHarness;
  let dir: string;
  /** Questions whose first engine request fails (HTTP 500): one sample of the group ends BACKEND_ERROR. */
  const flaky = new Set<string>();
  /** Questions every engine request of which fails while they are in this set. */
  const broken = new Set<string>();
  /** Engine requests seen per question. */
  const requests = new Map<string, number>();

  beforeAll(async () => {
    const { tokenizer } = await loadQwen3();
    const questionOf = (prompt: unknown): string | undefined => (Array.isArray(prompt) ? /What is [0-9+\-*() ]+\?/.exec(tokenizer.decode(prompt as number[]))?.[0] : undefined);
    h = await startServerHarness({
      engine: {
        tokenLatencyMs: 1,
        policy: createScriptedMathPolicy({ wrongAnswerRate: 0, malformedToolCallRate: 0 }),
        // TEST DOUBLE fault: the fake engine fails requests by the question in their prompt.
        inject: ({ body }) => {
          const question = questionOf(body.prompt);
          if (question === undefined) return undefined;
          const seen = (requests.get(question) ?? 0) + 1;
          requests.set(question, seen);
          if (broken.has(question) || (flaky.has(question) && seen === 1)) return { kind: 'status', status: 500, message: 'engine fell over' };
          return undefined;
        },
      },
    });
    dir = mkdtempSync(join(tmpdir(), 'rollout-retries-'));
  });
  afterAll(async () => {
    await h?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('re-submits the whole group of a row with a BACKEND_ERROR sample under a new task id; a wrong answer is not retried', async () => {
    const data = rows(7, 1000);
    flaky.add(data[1]!.problem);
    flaky.add(data[4]!.problem);
    const wrong = { ...data[6]!, answer: String(Number(data[6]!.answer) + 1) };
    const dataset = join(dir, 'flaky.jsonl');
    writeFileSync(dataset, [...data.slice(0, 6), wrong].map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'flaky.out.jsonl');
    const run = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--concurrency', '3', '--retries', '2', '--server', h.server.address, '--output', output]);
    expect(run.code, run.output).toBe(0);

    // The output holds one whole group per row: its last attempt.
    const lines = records(output);
    expect(lines).toHaveLength(14);
    const rowsOut = byRow(lines);
    expect(rowsOut.size).toBe(7);
    for (const [row, group] of rowsOut) {
      expect(group, `row ${row}`).toHaveLength(2);
      expect(new Set(group.map((l) => l.taskId)).size, `row ${row}: one attempt`).toBe(1);
      expect(group[0]!.groupId).toBe(group[0]!.taskId);
    }
    for (const row of ['1', '4']) {
      const group = rowsOut.get(row)!;
      expect(group[0]!.taskId).toMatch(/-attempt2$/);
      expect(group.every((l) => l.status === 'TRAJECTORY_STATUS_COMPLETED' && l.reward === 1 && l.metadata?.attempt === '2')).toBe(true);
    }
    for (const row of ['0', '2', '3', '5']) expect(rowsOut.get(row)!.every((l) => l.metadata?.attempt === '1' && !l.taskId.includes('attempt'))).toBe(true);
    // A wrong answer is the policy's outcome: reward 0, one attempt, its engine asked for its two samples only.
    expect(rowsOut.get('6')!.map((l) => [l.status, l.reward ?? 0, l.metadata?.attempt])).toEqual([
      ['TRAJECTORY_STATUS_COMPLETED', 0, '1'],
      ['TRAJECTORY_STATUS_COMPLETED', 0, '1'],
    ]);

    // The superseded attempts are kept beside the output, the failure's cause in them.
    const retried = records(`${output}.retried.jsonl`);
    expect(retried).toHaveLength(4);
    expect(new Set(retried.map((l) => l.metadata?.row_index))).toEqual(new Set(['1', '4']));
    expect(retried.every((l) => l.metadata?.attempt === '1')).toBe(true);
    expect(retried.filter((l) => l.status === 'TRAJECTORY_STATUS_BACKEND_ERROR')).toHaveLength(2);
    expect(retried.filter((l) => l.status === 'TRAJECTORY_STATUS_BACKEND_ERROR').every((l) => /500|engine fell over/.test(l.error ?? ''))).toBe(true);

    expect(run.output).toMatch(/row 1 attempt 1: 1 of 2 samples failed \(BACKEND_ERROR: [^)]*\); retrying as attempt 2/);
    expect(run.output).toMatch(/retries 2/);
    expect(run.output).toContain('7 rows submitted, 0 already complete');

    // Nothing left to do: a re-run submits nothing.
    const again = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--retries', '2', '--server', h.server.address, '--output', output]);
    expect(again.code, again.output).toBe(0);
    expect(again.output).toContain('0 rows submitted, 7 already complete');
    expect(records(output)).toHaveLength(14);
  });

  it('exits 3 naming the cause when retries run out; a re-run continues the count; a larger --retries tries again and supersedes the failed group', async () => {
    const data = rows(3, 2000);
    broken.add(data[2]!.problem);
    const dataset = join(dir, 'broken.jsonl');
    writeFileSync(dataset, data.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'broken.out.jsonl');
    const args = ['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--server', h.server.address, '--output', output];

    const first = await rollout([...args, '--retries', '1']);
    expect(first.code, first.output).toBe(3);
    expect(first.output).toMatch(/row 2 \(ds-[0-9a-f]+-2-[0-9a-f]+-attempt2\): infrastructure failures remain after 2 attempts: BACKEND_ERROR/);
    const failed = byRow(records(output)).get('2')!;
    expect(failed.map((l) => [l.status, l.metadata?.attempt])).toEqual([
      ['TRAJECTORY_STATUS_BACKEND_ERROR', '2'],
      ['TRAJECTORY_STATUS_BACKEND_ERROR', '2'],
    ]);
    expect(records(`${output}.retried.jsonl`).map((l) => l.metadata?.attempt)).toEqual(['1', '1']);
    const asked = requests.get(data[2]!.problem);

    // The same command: the row used its attempts, so nothing is submitted and infrastructure failures still remain.
    const second = await rollout([...args, '--retries', '1']);
    expect(second.code, second.output).toBe(3);
    expect(second.output).toContain('0 rows submitted, 2 already complete');
    expect(requests.get(data[2]!.problem)).toBe(asked);

    // The engine is mended and one more retry allowed: only that row runs, as attempt 3, and its failed group leaves the output.
    broken.delete(data[2]!.problem);
    const third = await rollout([...args, '--retries', '2']);
    expect(third.code, third.output).toBe(0);
    expect(third.output).toContain('1 rows submitted, 2 already complete');
    const lines = records(output);
    expect(lines).toHaveLength(6);
    const row2 = byRow(lines).get('2')!;
    expect(row2.every((l) => l.taskId.endsWith('-attempt3') && l.status === 'TRAJECTORY_STATUS_COMPLETED' && l.metadata?.attempt === '3')).toBe(true);
    expect(records(`${output}.retried.jsonl`).map((l) => l.metadata?.attempt).sort()).toEqual(['1', '1', '2', '2']);
  });

  it('SIGKILLed mid-retry: a re-run with --retries 0 keeps the last group of the row in the output, a later one with retries completes it; one whole group per row', async () => {
    const data = rows(3, 4000);
    flaky.add(data[1]!.problem);
    const dataset = join(dir, 'killed.jsonl');
    writeFileSync(dataset, data.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'killed.out.jsonl');
    const args = ['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--server', h.server.address, '--output', output];

    // Killed as soon as it reports the retry: attempt 1 has just been moved aside and attempt 2 submitted.
    const child = spawn(process.execPath, ['bin/rollout.js', ...args, '--retries', '2'], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' } });
    let log = '';
    const killed = new Promise<NodeJS.Signals | null>((resolve) => child.on('close', (_code, signal) => resolve(signal)));
    const onData = (d: Buffer): void => {
      log += d.toString();
      if (/row 1 attempt 1: .*retrying as attempt 2/.test(log)) child.kill('SIGKILL');
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    expect(await killed, log).toBe('SIGKILL');
    expect(records(`${output}.retried.jsonl`).filter((l) => l.metadata?.row_index === '1').map((l) => l.metadata?.attempt)).toEqual(['1', '1']);

    // No retries allowed now: the row's attempts are used up, and its last group (attempt 1, failed) is what the output holds.
    const noRetries = await rollout([...args, '--retries', '0']);
    expect(noRetries.code, noRetries.output).toBe(3);
    let rowsOut = byRow(records(output));
    expect(records(output), noRetries.output).toHaveLength(6);
    expect(rowsOut.get('1')!.map((l) => l.metadata?.attempt)).toEqual(['1', '1']);
    expect(rowsOut.get('1')!.some((l) => l.status === 'TRAJECTORY_STATUS_BACKEND_ERROR')).toBe(true);

    // Retries allowed again: attempt 2 (the one the killed run submitted) completes the row and supersedes attempt 1.
    const resumed = await rollout([...args, '--retries', '2']);
    expect(resumed.code, resumed.output).toBe(0);
    const lines = records(output);
    expect(lines).toHaveLength(6);
    rowsOut = byRow(lines);
    for (const [row, group] of rowsOut) {
      expect(group.map((l) => l.sampleIndex ?? 0).sort(), `row ${row}`).toEqual([0, 1]);
      expect(new Set(group.map((l) => l.taskId)).size, `row ${row}: one attempt`).toBe(1);
    }
    expect(rowsOut.get('1')!.every((l) => l.taskId.endsWith('-attempt2') && l.status === 'TRAJECTORY_STATUS_COMPLETED' && l.metadata?.attempt === '2')).toBe(true);
    const retried = records(`${output}.retried.jsonl`);
    expect(retried.map((l) => [l.metadata?.row_index, l.metadata?.attempt, l.sampleIndex ?? 0]).sort()).toEqual([
      ['1', '1', 0],
      ['1', '1', 1],
    ]);
    // Nothing of the killed run is left beside the output (its lock, held samples, temporary files).
    expect(readdirSync(dir).filter((f) => f.startsWith('killed.out.jsonl')).sort()).toEqual(['killed.out.jsonl', 'killed.out.jsonl.retried.jsonl']);
  });

  describe('a server that refuses tasks for now (RESOURCE_EXHAUSTED, UNAVAILABLE)', () => {
    /**
     * TEST DOUBLE at the runtime's admission: the real runtime's submit, refusing a task's first `times` submits as a
     * starting server does (UNAVAILABLE "server is starting"); `times` Infinity refuses them all.
     */
    function refuseFirst(times: number): { restore: () => void; refusals: () => number } {
      const runtime = h.server.runtime;
      const real = runtime.submit.bind(runtime);
      const seen = new Map<string, number>();
      let refusals = 0;
      runtime.submit = (spec, options) => {
        const n = (seen.get(spec.taskId) ?? 0) + 1;
        seen.set(spec.taskId, n);
        if (n <= times) {
          refusals++;
          return Promise.reject(new RolloutError('unavailable', 'server is starting'));
        }
        return real(spec, options);
      };
      return { restore: () => void (runtime.submit = real), refusals: () => refusals };
    }

    it('submits them again with backoff (the same task ids): every row completes, none is counted as bad data', async () => {
      const data = rows(3, 4000);
      const dataset = join(dir, 'refused.jsonl');
      writeFileSync(dataset, data.map((r) => JSON.stringify(r)).join('\n') + '\n');
      const output = join(dir, 'refused.out.jsonl');
      const refusing = refuseFirst(3);
      let run;
      try {
        run = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--server', h.server.address, '--output', output]);
      } finally {
        refusing.restore();
      }
      expect(run.code, run.output).toBe(0);
      expect(refusing.refusals()).toBe(9);
      const rowsOut = byRow(records(output));
      expect(rowsOut.size).toBe(3);
      for (const group of rowsOut.values()) expect(group.map((l) => [l.status, l.metadata?.attempt])).toEqual([['TRAJECTORY_STATUS_COMPLETED', '1'], ['TRAJECTORY_STATUS_COMPLETED', '1']]);
      expect(run.output).toMatch(/the server refuses tasks for now \(server is starting\); submitting them again with backoff/);
      expect(run.output).toContain('0 rejected or unmappable');
    });

    it('past --retry-refused-for, the row is an infrastructure failure (exit 3, re-run to resume), not a rejected row', async () => {
      const data = rows(2, 5000);
      const dataset = join(dir, 'refused-always.jsonl');
      writeFileSync(dataset, data.map((r) => JSON.stringify(r)).join('\n') + '\n');
      const output = join(dir, 'refused-always.out.jsonl');
      const refusing = refuseFirst(Infinity);
      let run;
      try {
        run = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--retry-refused-for', '1', '--server', h.server.address, '--output', output]);
      } finally {
        refusing.restore();
      }
      expect(run.code, run.output).toBe(3);
      expect(run.output).toMatch(/row 0 \([^)]*\) still refused after 1 s \(--retry-refused-for\): server is starting/);
      expect(run.output).toContain('0 rejected or unmappable');
      expect(run.output).toContain('2 rows with infrastructure failures left');
      expect(records(output)).toHaveLength(0);
      // Once the server admits again, the same command completes the run.
      const again = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--server', h.server.address, '--output', output]);
      expect(again.code, again.output).toBe(0);
      expect(records(output)).toHaveLength(2);
    });
  });

  it('--retries 0 keeps a failed group as it is and exits 3', async () => {
    const data = rows(2, 3000);
    flaky.add(data[0]!.problem);
    const dataset = join(dir, 'noretry.jsonl');
    writeFileSync(dataset, data.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'noretry.out.jsonl');
    const run = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--retries', '0', '--server', h.server.address, '--output', output]);
    expect(run.code, run.output).toBe(3);
    expect(records(output)).toHaveLength(4);
    expect(existsSync(`${output}.retried.jsonl`)).toBe(false);
    expect(records(output).filter((l) => l.status === 'TRAJECTORY_STATUS_BACKEND_ERROR')).toHaveLength(1);
  });
});
