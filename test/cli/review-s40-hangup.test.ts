import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { Stage, TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { NODE_FLAGS } from '../../src/cli/node-flags.js';
import { mathTask } from '../support/harness.js';
import { pidAlive, sandboxesOf, spawnServe } from '../support/rollout-process.js';
import { eventually, within } from '../support/wait.js';

/**
 * `rollout serve` and `rollout demo` started from a terminal that goes away (the window closed, the ssh session
 * dropped, no nohup): the kernel hangs the terminal up — SIGHUP, and every later write to it fails EIO. Run here on a
 * real pseudo-terminal (review-s40-pty.py, a test double of the terminal window) whose master side is closed.
 */

const root = fileURLToPath(new URL('../../', import.meta.url));

interface OnTerminal {
  /** The command's pid (the terminal's session leader). */
  pid: number;
  output(): string;
  /** Closes the terminal: the kernel hangs it up. */
  hangUp(): void;
  /** The command's end, as the terminal's owner saw it. */
  exited: Promise<{ code: number | null; signal: number | null }>;
  kill(): void;
}

/** Starts `node ...args` on a fresh pseudo-terminal and waits until it printed `ready`. */
async function onTerminal(args: string[], ready: RegExp): Promise<OnTerminal> {
  const child = spawn('python3', ['test/cli/review-s40-pty.py', process.execPath, ...args], {
    cwd: root,
    stdio: ['pipe', 'pipe', 'pipe'],
    env: { ...process.env, ROLLOUT_LOG_LEVEL: 'info' },
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const closed = new Promise<void>((resolve) => child.on('close', () => resolve()));
  let gone = false;
  void closed.then(() => (gone = true));
  await eventually(() => gone || (/PTY-CHILD (\d+)/.test(out) && ready.test(out)), 'the command to start on its terminal', 60_000);
  const pid = Number(/PTY-CHILD (\d+)/.exec(out)?.[1]);
  if (!ready.test(out)) throw new Error(`the command ended before it was ready:\n${out}`);
  return {
    pid,
    output: () => out,
    hangUp: () => child.stdin.write('hangup\n'),
    exited: closed.then(() => {
      const m = /PTY-EXIT (\{.*\})/.exec(out);
      if (!m) throw new Error(`no exit status:\n${out}`);
      return JSON.parse(m[1]!) as { code: number | null; signal: number | null };
    }),
    kill: () => {
      if (Number.isInteger(pid)) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
      child.kill('SIGKILL');
    },
  };
}

const CGROUP_ROOTS = ['/sys/fs/cgroup/pids/rollout-sandboxes', '/sys/fs/cgroup/memory/rollout-sandboxes'];

/** The sandbox cgroups process `pid` owns. */
function cgroupsOf(pid: number): string[] {
  return CGROUP_ROOTS.flatMap((r) => {
    try {
      return readdirSync(r).filter((d) => d.startsWith(`${pid}-`)).map((d) => join(r, d));
    } catch {
      return [];
    }
  });
}

/** The image mounts process `pid` owns (`<tmpdir>/rollout-images-<uid>/<pid>-...`). */
function mountsOf(pid: number): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => new RegExp(`/rollout-images-\\d+/${pid}-`).test(m));
}

describe('the terminal hangs up', () => {
  let running: OnTerminal | undefined;
  afterEach(() => running?.kill());

  // Regression: SIGHUP's default action killed the server at once: the four samples in flight were lost (the stream
  // ended UNAVAILABLE), and their sandboxes were left to the next start's reap. With SIGHUP handled but the logger
  // not, the drain's first log line threw EIO and killed the drain it had started.
  it('`rollout serve` drains as on SIGTERM: every sample in flight is delivered, exit 0, no sandbox or mount left', async () => {
    const serve = (running = await onTerminal([...NODE_FLAGS, 'bin/rollout.js', 'serve', '--port', '0', '--fake-engine', '--fake-latency-ms', '20'], /rollout server listening on \S+/));
    const address = /rollout server listening on (\S+)/.exec(serve.output())![1]!;
    const client = new RolloutClient(address);
    try {
      const session = client.openSession({ stageEvents: true });
      const runStarted = new Set<number>();
      session.onStage = (e) => {
        if (e.stage === Stage.STAGE_RUN) runStarted.add(e.sampleIndex);
      };
      await session.submit(mathTask('hup', 4, 7));
      session.close();
      const delivered: Trajectory[] = [];
      // The drain ends the stream once everything is delivered (UNAVAILABLE "server is shutting down", as on SIGTERM).
      const collecting = (async (): Promise<string | undefined> => {
        try {
          for await (const t of session.trajectories()) delivered.push(t);
        } catch (err) {
          return (err as Error).message;
        }
        return undefined;
      })();
      await eventually(() => runStarted.size === 4, 'all four samples to run', 60_000);
      expect(delivered).toHaveLength(0); // still in flight
      serve.hangUp();
      const ended = await within(collecting, 60_000, 'the trajectories in flight to be delivered');
      expect([undefined, '14 UNAVAILABLE: server is shutting down']).toContain(ended);
      expect(delivered.map((t) => t.status).sort()).toEqual(Array(4).fill(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED));
      expect(await within(serve.exited, 60_000, 'the server to exit')).toEqual({ code: 0, signal: null });
    } finally {
      client.close();
    }
    expect(await pidAlive(serve.pid)).toBe(false);
    expect(await sandboxesOf(serve.pid)).toEqual([]);
    expect({ cgroups: cgroupsOf(serve.pid), mounts: mountsOf(serve.pid) }).toEqual({ cgroups: [], mounts: [] });
  }, 180_000);

  // Regression: SIGHUP killed the demo before its cleanup: the image stayed mounted and the sandboxes' cgroups behind.
  it('`rollout demo` stops as on SIGTERM: sandboxes, image mount and engine released, exit 129', async () => {
    const demo = (running = await onTerminal(['bin/rollout.js', 'demo', '--groups', '4', '--group-size', '4', '--latency-ms', '300'], /demo: sandboxes from/));
    await eventually(() => cgroupsOf(demo.pid).length > 0 && mountsOf(demo.pid).length > 0, 'the demo\u2019s sandboxes to run', 60_000);
    expect(demo.output()).not.toMatch(/trajectories in/); // still running
    demo.hangUp();
    expect(await within(demo.exited, 60_000, 'the demo to exit')).toEqual({ code: 129, signal: null });
    expect({ cgroups: cgroupsOf(demo.pid), mounts: mountsOf(demo.pid) }).toEqual({ cgroups: [], mounts: [] });
  }, 180_000);
});

describe('a hang-up delivered more than once (an interactive shell passes its SIGHUP on, the kernel sends another as it exits)', () => {
  // Regression: each further SIGHUP counted as the operator insisting: the second cancelled the work in flight, the
  // third exited at once (code 1) without finishing the drain.
  it('`rollout serve`: only the first starts the drain; the others are ignored, and the drain finishes as on SIGTERM', async () => {
    const serve = await spawnServe(['--fake-engine', '--fake-latency-ms', '20']);
    const client = new RolloutClient(serve.address);
    try {
      const session = client.openSession({ stageEvents: true });
      const runStarted = new Set<number>();
      session.onStage = (e) => {
        if (e.stage === Stage.STAGE_RUN) runStarted.add(e.sampleIndex);
      };
      await session.submit(mathTask('hup-again', 4, 7));
      session.close();
      const delivered: Trajectory[] = [];
      const collecting = (async (): Promise<string | undefined> => {
        try {
          for await (const t of session.trajectories()) delivered.push(t);
        } catch (err) {
          return (err as Error).message;
        }
        return undefined;
      })();
      await eventually(() => runStarted.size === 4, 'all four samples to run', 60_000);
      serve.child.kill('SIGHUP');
      await eventually(() => serve.logs('draining on signal').length === 1, 'the drain to start', 30_000);
      for (const n of [1, 2]) {
        serve.child.kill('SIGHUP');
        await eventually(() => serve.logs('hang-up while draining: ignored (SIGTERM or SIGINT cancels the work in flight)').length === n, 'the hang-up to be ignored', 30_000);
      }
      expect([undefined, '14 UNAVAILABLE: server is shutting down']).toContain(await within(collecting, 60_000, 'the trajectories to be delivered'));
      expect(delivered.map((t) => t.status)).toEqual(Array(4).fill(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED));
      expect(await within(serve.exited, 60_000, 'the server to exit'), serve.output()).toEqual({ code: 0, signal: null });
      expect(serve.logs('draining on signal')[0]).toMatchObject({ signal: 'SIGHUP' });
    } finally {
      client.close();
      serve.kill();
    }
    expect(await sandboxesOf(serve.pid)).toEqual([]);
  }, 180_000);

  it('`rollout demo`: a second SIGHUP does not cut its cleanup short: exit 129, nothing left behind', async () => {
    const child = spawn(process.execPath, ['bin/rollout.js', 'demo', '--groups', '4', '--group-size', '4', '--latency-ms', '300'], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
    const pid = child.pid!;
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
    try {
      await eventually(() => cgroupsOf(pid).length > 0 && mountsOf(pid).length > 0, 'the demo\u2019s sandboxes to run', 60_000);
      child.kill('SIGHUP');
      await eventually(() => /demo: SIGHUP: stopping/.test(out), 'the demo to stop', 30_000);
      child.kill('SIGHUP');
      expect(await within(exited, 60_000, 'the demo to exit'), out).toBe(129);
      expect(out).toMatch(/demo: stopped by a signal after \d+\/16 trajectories/);
      expect({ cgroups: cgroupsOf(pid), mounts: mountsOf(pid) }).toEqual({ cgroups: [], mounts: [] });
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  }, 180_000);
});
