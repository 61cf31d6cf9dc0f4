import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { Socket } from 'node:net';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeMathProblem } from '../../src/testing/arithmetic.js';
import { createScriptedMathPolicy } from '../../src/testing/scripted-policy.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually, within } from '../support/wait.js';

/**
 * `rollout submit`, `image build` and `swe build` stopped by a hang-up (the terminal window closed, the ssh session
 * dropped) or a second hang-up: before, SIGHUP's default action killed node at once — a submit died mid-write (a torn
 * line, no summary, no Parquet file), a build left its work dir and its tools running. Now a hang-up stops them as
 * SIGINT does (exit 129), a repeated one is ignored, and SIGTERM ends an image build with 143, not "rollout:
 * interrupted" and 1. The terminal is a real pseudo-terminal (review-s40-pty.py, a test double of a terminal window)
 * whose master side is closed: SIGHUP, then EIO on every write.
 */

const root = fileURLToPath(new URL('../../', import.meta.url));
let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'rollout-stop-signals-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Run {
  child: ChildProcess;
  output(): string;
  /** The command's exit as seen by its parent (for a run on a terminal: as the terminal saw it). */
  exited: Promise<{ code: number | null; signal: number | string | null }>;
  /** The command's pid. */
  pid(): number | undefined;
  /** Closes the terminal (only for a run on one): the kernel hangs it up. */
  hangUp(): void;
}

/** Runs `node bin/rollout.js ...args`, on a fresh pseudo-terminal when `terminal`. */
function rollout(args: string[], terminal: boolean): Run {
  const argv = terminal ? ['test/cli/review-s40-pty.py', process.execPath, 'bin/rollout.js', ...args] : ['bin/rollout.js', ...args];
  const child = spawn(terminal ? 'python3' : process.execPath, argv, { cwd: root, stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' } });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const closed = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
  const pid = (): number | undefined => (terminal ? Number(/PTY-CHILD (\d+)/.exec(out)?.[1]) || undefined : child.pid);
  const exited = terminal
    ? closed.then(() => {
        const m = /PTY-EXIT (\{.*\})/.exec(out);
        if (!m) throw new Error(`no exit status:\n${out}`);
        return JSON.parse(m[1]!) as { code: number | null; signal: number | null };
      })
    : closed;
  return { child, output: () => out, exited, pid, hangUp: () => child.stdin!.write('hangup\n') };
}

/** Kills what is left of a run (by pid) when a test failed half-way. */
function killLeft(run: Run | undefined): void {
  const pid = run?.pid();
  for (const p of [pid, run?.child.pid]) {
    if (p === undefined) continue;
    try {
      process.kill(p, 'SIGKILL');
    } catch {
      // gone
    }
  }
}

/** The output's records; throws on a line that does not parse (a torn line). */
function records(path: string): Array<{ taskId: string; sampleIndex?: number; status: string }> {
  return readFileSync(path, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as { taskId: string; sampleIndex?: number; status: string });
}

function mathDataset(name: string, n: number, seed: number): string {
  const path = join(dir, `${name}.jsonl`);
  const rows = Array.from({ length: n }, (_, i) => {
    const p = makeMathProblem(seed + i);
    return { problem: p.question, answer: String(p.answer) };
  });
  writeFileSync(path, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  return path;
}

describe('rollout submit stopped by a hang-up (CLI child process against a real server)', () => {
  let h: ServerHarness;
  let run: Run | undefined;
  beforeAll(async () => {
    // A few ms per token keeps a 2-turn trajectory in flight long enough to hang up part-way.
    h = await startServerHarness({ engine: { tokenLatencyMs: 2, policy: createScriptedMathPolicy({ wrongAnswerRate: 0, malformedToolCallRate: 0 }) } });
  });
  afterAll(async () => {
    killLeft(run);
    await h?.close();
  });

  it('its terminal hangs up mid-run (progress bar on it): exit 129, whole lines, and a re-run finishes the dataset', async () => {
    const dataset = mathDataset('hup-terminal', 16, 900);
    const output = join(dir, 'hup-terminal.out.jsonl');
    const args = ['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--concurrency', '2', '--server', h.server.address, '--output', output];
    run = rollout(args, true);
    await eventually(() => existsSync(output) && records(output).length >= 4, 'four trajectories in the output', 60_000);
    expect(run.output()).toMatch(/trajectories .*\d+\/32/); // the bar is on the terminal
    run.hangUp();
    expect(await within(run.exited, 60_000, 'submit to exit'), run.output()).toEqual({ code: 129, signal: null });
    expect(readFileSync(output, 'utf8').endsWith('\n')).toBe(true);
    const first = records(output).length;
    expect(first).toBeLessThan(32);

    const again = (run = rollout(args, false));
    expect(await within(again.exited, 60_000, 'the re-run to exit'), again.output()).toEqual({ code: 0, signal: null });
    const lines = records(output);
    expect(lines).toHaveLength(32);
    expect(new Set(lines.map((l) => `${l.taskId}#${l.sampleIndex ?? 0}`)).size).toBe(32);
  }, 180_000);

  it('a hang-up delivered twice stops it once: exit 129 with its summary, not killed by the second', async () => {
    const dataset = mathDataset('hup-twice', 16, 1900);
    const output = join(dir, 'hup-twice.out.jsonl');
    run = rollout(['submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--concurrency', '2', '--server', h.server.address, '--output', output], false);
    await eventually(() => existsSync(output) && records(output).length >= 4, 'four trajectories in the output', 60_000);
    run.child.kill('SIGHUP');
    run.child.kill('SIGHUP');
    const ran = run;
    expect(await within(ran.exited, 60_000, 'submit to exit'), ran.output()).toEqual({ code: 129, signal: null });
    expect(ran.output()).toMatch(/\[submit\] interrupted: \d+ trajectories written this run/);
    expect(ran.output()).toContain('run the same command again to resume');
    records(output); // no torn line
  }, 120_000);
});

const hasBuildTools = ((): boolean => {
  try {
    execFileSync('sh', ['-c', '(command -v debootstrap || test -x /usr/sbin/debootstrap) && command -v mksquashfs && command -v siftool']);
    return process.getuid?.() === 0;
  } catch {
    return false;
  }
})();

/**
 * A Debian mirror (test double) that takes every request and never answers: debootstrap waits on its Release file
 * until it is killed. Counts connections open.
 */
async function hangingMirror(): Promise<{ url: string; open: () => number; requests: () => number; close: () => Promise<void> }> {
  const sockets = new Set<Socket>();
  let requests = 0;
  const server: Server = createServer(() => requests++);
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}/debian`,
    open: () => sockets.size,
    requests: () => requests,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

const workDirs = (cache: string): string[] => (existsSync(cache) ? readdirSync(cache).filter((f) => f.startsWith('.build-')) : []);

describe.skipIf(!hasBuildTools)('rollout image build stopped by a signal while debootstrap runs (needs root, debootstrap, mksquashfs, siftool)', () => {
  let run: Run | undefined;
  let mirror: Awaited<ReturnType<typeof hangingMirror>> | undefined;
  afterAll(async () => {
    killLeft(run);
    await mirror?.close();
  });

  for (const how of ['hang-up', 'SIGTERM'] as const) {
    it(`${how}: debootstrap killed (its fetch's connection closed), the work dir removed, exit ${how === 'hang-up' ? 129 : 143}, no stack trace`, async () => {
      mirror = await hangingMirror();
      const cache = join(dir, `image-cache-${how}`);
      run = rollout(['image', 'build', '--mirror', mirror.url, '--cache-dir', cache, '--packages', 'bash'], how === 'hang-up');
      await eventually(() => mirror!.requests() > 0 && workDirs(cache).length === 1, 'debootstrap to fetch from the mirror', 60_000);
      if (how === 'hang-up') run.hangUp();
      else run.child.kill('SIGTERM');
      const ended = await within(run.exited, 60_000, 'the build to exit');
      expect(ended, run.output()).toEqual({ code: how === 'hang-up' ? 129 : 143, signal: null });
      expect(run.output()).not.toMatch(/\n\s+at .*\.(ts|js):\d+/);
      if (how === 'SIGTERM') expect(run.output()).toContain('image build: SIGTERM: stopped, its work dir removed');
      expect(workDirs(cache)).toEqual([]);
      await eventually(() => mirror!.open() === 0, 'the fetch\u2019s connection to close', 10_000);
      await mirror.close();
      mirror = undefined;
    }, 120_000);
  }
});
