import { credentials, Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { RolloutServiceClient, TaskSpec, TrajectoryStatus, type RolloutRequest, type RolloutResponse, type Trajectory, type WatchResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { AdminServiceClient, ServerState, type GetServerStateResponse } from '../../gen/ts/rollout/v1/admin.js';
import { mathTask } from '../support/harness.js';
import { healthStatuses } from '../support/health.js';
import { pidAlive, sandboxesOf, spawnServe, type ServeProcess } from '../support/rollout-process.js';
import { eventually, within } from '../support/wait.js';

const ADMIN_TOKEN = 'drain-admin-5b1e';

/** One Rollout stream, recorded: what was accepted and rejected, every trajectory, and the status it ended with. */
class RecordedStream {
  readonly accepted = new Map<string, number>();
  readonly rejected: { taskId: string; reason: string }[] = [];
  readonly trajectories: Trajectory[] = [];
  readonly ended: Promise<{ code: number; details: string }>;
  private readonly call;

  constructor(stub: RolloutServiceClient) {
    this.call = stub.rollout();
    this.call.on('data', (response: RolloutResponse) => {
      const kind = response.kind;
      if (kind?.$case === 'accepted') this.accepted.set(kind.value.taskId, kind.value.numSamples);
      else if (kind?.$case === 'rejected') this.rejected.push({ taskId: kind.value.taskId, reason: kind.value.reason });
      else if (kind?.$case === 'trajectory') this.trajectories.push(kind.value);
    });
    this.ended = new Promise((resolve) => {
      this.call.on('error', (err: ServiceError) => resolve({ code: err.code, details: err.details }));
      this.call.on('status', (s: { code: number; details: string }) => {
        if (s.code === status.OK) resolve(s);
      });
    });
    this.write({ kind: { $case: 'open', value: { sessionId: '', resume: false, stageEvents: false } } });
  }

  write(request: RolloutRequest): void {
    this.call.write(request);
  }

  submit(taskId: string, numSamples: number, seed: number): void {
    this.write({ kind: { $case: 'task', value: TaskSpec.fromPartial(mathTask(taskId, numSamples, seed)) } });
  }

  get expected(): number {
    return [...this.accepted.values()].reduce((a, b) => a + b, 0);
  }

  /** "taskId/sampleIndex" of every trajectory received, to see each arrived exactly once. */
  keys(): string[] {
    return this.trajectories.map((t) => `${t.taskId}/${t.sampleIndex}`);
  }
}

/** The status a Watch ended with. */
function watchEnd(stub: RolloutServiceClient): Promise<{ code: number; details: string }> {
  const call = stub.watch({ environments: [], groupIds: [], stageEvents: true, fullTrajectories: false, statsIntervalMs: 0 });
  return new Promise((resolve) => {
    call.on('data', (_: WatchResponse) => undefined);
    call.on('error', (err: ServiceError) => resolve({ code: err.code, details: err.details }));
  });
}

function adminMetadata(token: string | undefined): Metadata {
  const metadata = new Metadata();
  if (token !== undefined) metadata.set('authorization', `Bearer ${token}`);
  return metadata;
}

function serverState(admin: AdminServiceClient): Promise<GetServerStateResponse> {
  return new Promise((resolve, reject) => admin.getServerState({}, adminMetadata(ADMIN_TOKEN), (err, value) => (err ? reject(err) : resolve(value!))));
}

describe('lifecycle: a real `rollout serve` drains on SIGTERM and on AdminService.Drain', () => {
  let dir: string;
  let tokenFile: string;
  let serve: ServeProcess | undefined;
  const stubs: { close(): void }[] = [];
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'rollout-drain-'));
    tokenFile = join(dir, 'admin-token');
    await writeFile(tokenFile, `${ADMIN_TOKEN}\n`, { mode: 0o600 });
  });
  afterEach(() => {
    for (const stub of stubs.splice(0)) stub.close();
    serve?.kill();
    serve = undefined;
  });
  afterAll(() => rm(dir, { recursive: true, force: true }));

  it('SIGTERM mid-load: admission stops, every accepted sample is delivered once, health goes NOT_SERVING, streams end UNAVAILABLE, no sandbox is left, exit 0', async () => {
    // 30 ms per sampled token: each sample runs for seconds, so the signal lands while work is in flight.
    serve = await spawnServe(['--fake-engine', '--fake-latency-ms', '30', '--admin-token-file', tokenFile, '--drain-grace-ms', '120000']);
    const { address, pid } = serve;
    // The admin token came from a file: it is not in the process's command line.
    expect(serve.child.spawnargs.join(' ')).not.toContain(ADMIN_TOKEN);
    const stub = new RolloutServiceClient(address, credentials.createInsecure());
    const admin = new AdminServiceClient(address, credentials.createInsecure());
    stubs.push(stub, admin);
    expect(Object.values(await healthStatuses(address))).toEqual(['SERVING', 'SERVING', 'SERVING', 'SERVING']);

    const stream = new RecordedStream(stub);
    const watch = watchEnd(stub);
    for (let i = 0; i < 8; i++) stream.submit(`load-${i}`, 2, 100 + i);
    await eventually(() => stream.accepted.size === 8, 'all 8 tasks accepted', 60_000);
    // Real sandboxes are running (math samples get one for their tools) when the signal comes.
    const seen = new Set<number>();
    await eventually(async () => {
      const live = await sandboxesOf(pid);
      for (const s of live) s.pids.forEach((p) => seen.add(p));
      return seen.size > 0;
    }, 'processes in the server\'s sandboxes', 60_000);
    expect(stream.trajectories.length).toBeLessThan(16);

    serve.child.kill('SIGTERM');
    await eventually(async () => Object.values(await healthStatuses(address)).every((s) => s === 'NOT_SERVING'), 'every health service NOT_SERVING', 30_000);
    expect((await serverState(admin)).state).toBe(ServerState.SERVER_STATE_DRAINING);
    // Admission is closed: a task on the open stream is rejected saying so; a unary Submit is UNAVAILABLE.
    stream.submit('late', 1, 999);
    await eventually(() => stream.rejected.some((r) => r.taskId === 'late'), 'the late task to be rejected', 30_000);
    expect(stream.rejected.find((r) => r.taskId === 'late')!.reason).toMatch(/draining/);
    const submitted = await new Promise<ServiceError | null>((resolve) => stub.submit({ task: TaskSpec.fromPartial(mathTask('late-unary', 1, 998)) }, (err) => resolve(err)));
    expect(submitted?.code).toBe(status.UNAVAILABLE);
    expect(submitted?.details).toMatch(/draining/);

    const ended = await within(stream.ended, 120_000, 'the stream to end');
    expect(ended.code).toBe(status.UNAVAILABLE);
    expect((await within(watch, 30_000, 'the watch to end')).code).toBe(status.UNAVAILABLE);
    // Every accepted sample arrived exactly once and finished its work (the grace period was long enough).
    expect(stream.expected).toBe(16);
    expect(stream.keys().sort()).toEqual([...new Set(stream.keys())].sort());
    expect(stream.trajectories).toHaveLength(16);
    expect(stream.trajectories.every((t) => t.status === TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED || t.status === TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED)).toBe(true);

    expect(await within(serve.exited, 60_000, 'the server to exit')).toEqual({ code: 0, signal: null });
    expect(serve.output()).toContain('rollout server stopped');
    expect(await sandboxesOf(pid)).toEqual([]);
    expect(seen.size).toBeGreaterThan(0);
    const alive = (await Promise.all([...seen].map(async (p) => ((await pidAlive(p)) ? p : undefined)))).filter((p) => p !== undefined);
    expect(await Promise.all(alive.map(async (p) => `${p}: ${await readFile(`/proc/${p}/stat`, 'utf8').catch(() => '')} ${await readFile(`/proc/${p}/cmdline`, 'utf8').catch(() => '')}`))).toEqual([]);
  }, 240_000);

  it('Drain needs the admin token; past its grace the work in flight is delivered CANCELLED (never a reward-0 completion), then exit 0', async () => {
    // 400 ms per token: no sample can finish within the 1.5 s grace.
    serve = await spawnServe(['--fake-engine', '--fake-latency-ms', '400', '--admin-token-file', tokenFile]);
    const { address, pid } = serve;
    const stub = new RolloutServiceClient(address, credentials.createInsecure());
    const admin = new AdminServiceClient(address, credentials.createInsecure());
    stubs.push(stub, admin);

    for (const token of [undefined, 'wrong']) {
      const refused = await new Promise<ServiceError | null>((resolve) => admin.drain({ graceMs: 0 }, adminMetadata(token), (err) => resolve(err)));
      expect(refused?.code).toBe(status.UNAUTHENTICATED);
    }
    expect((await serverState(admin)).state).toBe(ServerState.SERVER_STATE_RUNNING);

    const stream = new RecordedStream(stub);
    for (let i = 0; i < 4; i++) stream.submit(`slow-${i}`, 2, 200 + i);
    await eventually(() => stream.accepted.size === 4, 'all 4 tasks accepted', 60_000);
    await eventually(async () => (await sandboxesOf(pid)).length > 0, 'sandboxes of the server to be running', 60_000);

    const before = Date.now();
    const answer = await new Promise<{ state: ServerState; deadlineUnixMs: number }>((resolve, reject) =>
      admin.drain({ graceMs: 1_500 }, adminMetadata(ADMIN_TOKEN), (err, value) => (err ? reject(err) : resolve(value!))),
    );
    expect(answer.state).toBe(ServerState.SERVER_STATE_DRAINING);
    expect(answer.deadlineUnixMs).toBeGreaterThanOrEqual(before + 1_500 - 1_000);

    const ended = await within(stream.ended, 60_000, 'the stream to end');
    expect(ended.code).toBe(status.UNAVAILABLE);
    expect(stream.trajectories).toHaveLength(8);
    expect([...new Set(stream.keys())]).toHaveLength(8);
    for (const t of stream.trajectories) {
      expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED);
      expect(t.error).toMatch(/grace period/);
    }
    expect(await within(serve.exited, 60_000, 'the server to exit')).toEqual({ code: 0, signal: null });
    expect(await sandboxesOf(pid)).toEqual([]);
  }, 180_000);

  it('a second SIGTERM during a long grace cancels the work in flight at once', async () => {
    serve = await spawnServe(['--fake-engine', '--fake-latency-ms', '400', '--drain-grace-ms', '600000']);
    const stub = new RolloutServiceClient(serve.address, credentials.createInsecure());
    stubs.push(stub);
    const stream = new RecordedStream(stub);
    stream.submit('stuck', 2, 300);
    await eventually(() => stream.accepted.size === 1, 'the task accepted', 60_000);
    serve.child.kill('SIGTERM');
    await eventually(async () => Object.values(await healthStatuses(serve!.address)).every((s) => s === 'NOT_SERVING'), 'draining', 30_000);
    serve.child.kill('SIGTERM');
    const end = await within(stream.ended, 60_000, 'the stream to end');
    expect(end.code, `${end.details}\n${serve.output()}`).toBe(status.UNAVAILABLE);
    expect(stream.trajectories.map((t) => t.status)).toEqual([TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED, TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED]);
    expect(await within(serve.exited, 60_000, 'the server to exit')).toEqual({ code: 0, signal: null });
  }, 120_000);
});
