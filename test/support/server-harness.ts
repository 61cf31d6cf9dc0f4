import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { expect } from 'vitest';
import { startRolloutServer, type RolloutServer } from '../../src/app.js';
import type { ServerConfigInput } from '../../src/config.js';
import { RolloutClient, type RolloutSession } from '../../src/client/rollout-client.js';
import { silentLogger, type Logger } from '../../src/observability/logger.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { SandboxDriver } from '../../src/sandboxes/types.js';
import type { EnvironmentRegistry } from '../../src/environments/registry.js';
import { FakeVllmEngine, type FakeVllmOptions } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { TaskLimits, Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { TaskInput } from '../../src/client/rollout-client.js';
import { collect, invariantViolations } from './harness.js';

export interface ServerHarnessOptions {
  /** Server config; `backends` defaults to the fake engine. */
  config?: ServerConfigInput;
  engine?: Partial<FakeVllmOptions>;
  /**
   * Sandbox driver. Default: a real BubblewrapDriver whose work dirs live under a private temp root, so a test
   * can count the `rollout-sbx-*` dirs it leaves behind without seeing other test files' sandboxes.
   */
  sandboxes?: SandboxDriver;
  /** Environments the server offers (default: the built-ins). */
  registry?: EnvironmentRegistry;
  /** The server's root logger (default: silent); tests pass one writing to a buffer to read the logs. */
  logger?: Logger;
  /** Replaces the token worker's script (a TEST DOUBLE that crashes on cue). */
  tokenWorkerScript?: URL;
}

export interface ServerHarness {
  engine: FakeVllmEngine;
  server: RolloutServer;
  client: RolloutClient;
  /** Host dir holding the bubblewrap work dirs (undefined when a custom driver was given). */
  sandboxRoot: string | undefined;
  /** Stops client, server and engine (idempotent), and removes the private sandbox root. */
  close(): Promise<void>;
}

/**
 * A real server on 127.0.0.1:0 routed to the fake vLLM engine (test double), with the seams failure tests
 * need: any sandbox driver, any backends, bubblewrap work dirs kept apart. (harness.ts's startHarness is this
 * with defaults.)
 */
export async function startServerHarness(options: ServerHarnessOptions = {}): Promise<ServerHarness> {
  const { tokenizer } = await loadQwen3();
  const engine = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: 0, ...options.engine });
  // Named after the test file, so a root the run's leftover check finds says which file left it.
  const sandboxRoot = options.sandboxes ? undefined : await mkdtemp(join(tmpdir(), `rollout-test-root-${basename(expect.getState().testPath ?? 'unknown', '.test.ts')}-`));
  const removeRoot = async (): Promise<void> => {
    if (sandboxRoot) await rm(sandboxRoot, { recursive: true, force: true });
  };
  const sandboxes = options.sandboxes ?? new BubblewrapDriver({ logger: silentLogger(), tmpRoot: sandboxRoot! });
  let server: RolloutServer;
  try {
    server = await startRolloutServer(
      { port: 0, model: engine.model, backends: [{ url: engine.url, maxConcurrency: 256 }], ...options.config },
      {
        logger: options.logger ?? silentLogger(),
        sandboxes,
        ...(options.registry && { registry: options.registry }),
        ...(options.tokenWorkerScript && { tokenWorkerScript: options.tokenWorkerScript }),
      },
    );
  } catch (err) {
    // A server that did not start (a test of a refused config) leaves neither its engine nor its work dir behind.
    await engine.close();
    await removeRoot();
    throw err;
  }
  const client = new RolloutClient(server.address, options.config?.adminToken ? { adminToken: options.config.adminToken } : {});
  let closing: Promise<void> | undefined;
  return {
    engine,
    server,
    client,
    sandboxRoot,
    close: () =>
      (closing ??= (async () => {
        try {
          client.close();
          await server.shutdown();
        } finally {
          // Also when the shutdown throws (a test that stopped the server its own way): nothing left behind.
          await engine.close();
          await removeRoot();
        }
      })()),
  };
}

/**
 * The bubblewrap sandboxes of this process that still exist on the host: their cgroups (a sandbox keeps no host
 * directory; its cgroups are removed only after every one of its processes is gone).
 */
/**
 * Runs `tasks` (messages included) through one session of the harness's server and returns their trajectories by
 * task id, one per task, each checked against the trajectory invariants.
 */
export async function runTasks(h: ServerHarness, tasks: TaskInput[]): Promise<Map<string, Trajectory>> {
  const session = h.client.openSession();
  await Promise.all(tasks.map((t) => session.submit({ includeMessages: true, ...t })));
  session.close();
  const trajectories = await collect(session.trajectories());
  expect(trajectories).toHaveLength(tasks.length);
  for (const t of trajectories) expect(invariantViolations(t)).toEqual([]);
  return new Map(trajectories.map((t) => [t.taskId, t]));
}

export async function liveSandboxes(): Promise<string[]> {
  const root = '/sys/fs/cgroup/pids/rollout-sandboxes';
  const owners = (await readdir(root).catch(() => [] as string[])).filter((o) => o.startsWith(`${process.pid}-`));
  const found = await Promise.all(owners.map(async (o) => (await readdir(join(root, o), { withFileTypes: true }).catch(() => [])).filter((e) => e.isDirectory()).map((e) => e.name)));
  return found.flat();
}

/** An http URL on 127.0.0.1 where nothing listens (a port that was just free). */
export async function deadUrl(): Promise<string> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return `http://127.0.0.1:${port}`;
}

/** TaskLimits with only the given fields set (0 means "server default"). */
export function limits(set: Partial<TaskLimits>): TaskLimits {
  return { maxTurns: 0, initTimeoutMs: 0, runTimeoutMs: 0, evalTimeoutMs: 0, totalTimeoutMs: 0, ...set };
}

/**
 * Reads trajectories from a session one at a time, so a test can wait for some, submit more on the same
 * stream, and only then close it.
 */
export class TrajectoryReader {
  private readonly iterator: AsyncIterator<Trajectory>;
  readonly received: Trajectory[] = [];

  constructor(session: RolloutSession) {
    this.iterator = session.trajectories()[Symbol.asyncIterator]();
  }

  /** The next `n` trajectories (fails if the stream ends first). */
  async take(n: number): Promise<Trajectory[]> {
    const out: Trajectory[] = [];
    while (out.length < n) {
      const next = await this.iterator.next();
      if (next.done) throw new Error(`stream ended after ${out.length} of ${n} trajectories`);
      out.push(next.value);
      this.received.push(next.value);
    }
    return out;
  }

  /** Everything until the stream ends (call after `session.close()`). */
  async rest(): Promise<Trajectory[]> {
    const out: Trajectory[] = [];
    for (let next = await this.iterator.next(); !next.done; next = await this.iterator.next()) {
      out.push(next.value);
      this.received.push(next.value);
    }
    return out;
  }
}
