import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { Stage } from '../../gen/ts/rollout/v1/rollout.js';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { NODE_FLAGS } from '../../src/cli/node-flags.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import { mathTask } from '../support/harness.js';
import { pidAlive, sandboxesOf } from '../support/rollout-process.js';
import { eventually, within } from '../support/wait.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

interface Child {
  pid: number;
  address: string;
  output(): string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  signal(name: NodeJS.Signals): void;
  kill(): void;
}

/** Starts review-s38-stuck-stop-serve.ts (`rollout serve` whose sandboxes never finish stopping) and waits for it to listen. */
async function startStuckServe(): Promise<Child> {
  const child = spawn(process.execPath, [...NODE_FLAGS, '--import', 'tsx', 'test/cli/review-s38-stuck-stop-serve.ts', '--fake-latency-ms', '400'], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ROLLOUT_LOG_LEVEL: 'info' },
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
  let gone = false;
  void exited.then(() => (gone = true));
  await eventually(() => gone || /rollout server listening on (\S+)/.test(out), 'the server to listen', 60_000);
  const match = out.match(/rollout server listening on (\S+)/);
  if (!match) throw new Error(`the server exited before listening:\n${out}`);
  return {
    pid: child.pid!,
    address: match[1]!,
    output: () => out,
    exited,
    signal: (name) => child.kill(name),
    kill: () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    },
  };
}

/** The parsed JSON log lines whose msg starts with `prefix`. */
function logs(out: string, prefix: string): Record<string, unknown>[] {
  return out
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((l) => typeof l.msg === 'string' && l.msg.startsWith(prefix));
}

describe('`rollout serve` whose drain hangs (a sandbox stop that never returns) still exits when the operator insists', () => {
  let serve: Child | undefined;
  afterEach(() => serve?.kill());
  // A hard exit leaves the sandboxes' (empty) cgroups for the next server's start to reap, as an operator's restart does.
  afterAll(async () => {
    await new BubblewrapDriver().reap();
  });

  /** A server with two samples running in real sandboxes, drained (first signal) and told to hurry (second). */
  async function stuckAfterTwoSignals(): Promise<{ serve: Child; sandboxPids: number[] }> {
    serve = await startStuckServe();
    const client = new RolloutClient(serve.address);
    try {
      const session = client.openSession({ stageEvents: true });
      // Both samples in the run stage: each holds its started sandbox, which the drain's cancel must stop.
      const running = new Set<number>();
      session.onStage = (e) => {
        if (e.stage === Stage.STAGE_RUN) running.add(e.sampleIndex);
      };
      await session.submit(mathTask('stuck', 2, 7));
      await eventually(() => running.size === 2, 'both samples to run', 60_000);
      const seen = new Set<number>();
      await eventually(async () => {
        for (const s of await sandboxesOf(serve!.pid)) s.pids.forEach((p) => seen.add(p));
        return seen.size > 0;
      }, "processes in the server's sandboxes", 60_000);
      serve.signal('SIGTERM');
      await eventually(() => logs(serve!.output(), 'draining on signal').length > 0, 'the drain to start', 30_000);
      serve.signal('SIGTERM');
      await eventually(() => logs(serve!.output(), 'second signal').length > 0, 'the second signal to be taken', 30_000);
      return { serve, sandboxPids: [...seen] };
    } finally {
      client.close();
    }
  }

  async function expectNoSandboxProcessLeft(pid: number, sandboxPids: number[]): Promise<void> {
    // bwrap --die-with-parent: the kernel kills each sandbox's tree when the server dies.
    await eventually(async () => (await Promise.all(sandboxPids.map(pidAlive))).every((alive) => !alive), 'every sandbox process to be gone', 30_000);
    for (const s of await sandboxesOf(pid)) expect(s.pids, s.name).toEqual([]);
  }

  // Regression: the third SIGTERM started the same drain again and the process stayed, stuck, until SIGKILL.
  it('a third signal exits at once, code 1, with one log line naming what was pending; no sandbox process is left', async () => {
    const { serve, sandboxPids } = await stuckAfterTwoSignals();
    serve.signal('SIGTERM');
    expect(await within(serve.exited, 30_000, 'the server to exit on the third signal'), serve.output()).toEqual({ code: 1, signal: null });
    const [line, ...more] = logs(serve.output(), 'exiting without finishing the drain');
    expect(more).toEqual([]);
    expect(line, serve.output()).toMatchObject({ level: 60, msg: 'exiting without finishing the drain: third signal (SIGTERM)', state: 'draining' });
    // Both samples were cancelled and left the count; their sandboxes' stop is what never ended.
    expect(line!.pending).toBe('the release of the cancelled samples (a sandbox stop, an engine call or a delivery that does not return)');
    await expectNoSandboxProcessLeft(serve.pid, sandboxPids);
  }, 180_000);

  it('without a third signal, the drain gets a bounded time after the second, then the process exits the same way', async () => {
    const { serve, sandboxPids } = await stuckAfterTwoSignals();
    expect(await within(serve.exited, 90_000, 'the server to exit after the second signal'), serve.output()).toEqual({ code: 1, signal: null });
    const [line] = logs(serve.output(), 'exiting without finishing the drain');
    expect(line, serve.output()).toMatchObject({ msg: 'exiting without finishing the drain: the process did not end within 30000 ms of the second signal', state: 'draining' });
    await expectNoSandboxProcessLeft(serve.pid, sandboxPids);
  }, 180_000);
});
