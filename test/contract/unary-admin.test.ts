import { credentials, loadPackageDefinition, Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import { protoPath as healthProtoPath } from 'grpc-health-check';
import { createRequire } from 'node:module';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { invariantViolations, mathTask, startHarness, type Harness } from '../support/harness.js';
import { eventually } from '../support/wait.js';

const require = createRequire(import.meta.url);

describe('unary RPCs, BackendService, health and reflection', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ adminToken: 'sekret' });
  });
  afterAll(async () => h?.close());

  it('Submit is idempotent on task_id and GetTrajectory waits for the whole group', async () => {
    const first = await h.client.submit(mathTask('unary-1', 3, 41));
    const second = await h.client.submit(mathTask('unary-1', 3, 41));
    expect(first).toEqual({ taskId: 'unary-1', numSamples: 3, duplicate: false });
    expect(second.duplicate).toBe(true);
    const got = await h.client.getTrajectory('unary-1', { wait: true, deadlineMs: 60_000 });
    expect(got.pending).toBe(0);
    expect(got.trajectories.map((t) => t.sampleIndex)).toEqual([0, 1, 2]);
    for (const t of got.trajectories) expect(invariantViolations(t)).toEqual([]);
    const one = await h.client.getTrajectory('unary-1', { sampleIndex: 1 });
    expect(one.trajectories).toHaveLength(1);
    expect(one.trajectories[0]!.sampleIndex).toBe(1);
  });

  it('a call asked with a deadline 30 days away waits for its answer (the client caps it at what grpc-js holds)', async () => {
    // Regression: the call failed at once with DEADLINE_EXCEEDED. A grpc-js server truncates the grpc-timeout's
    // milliseconds to an int32 (negative past ~24.8 days), and our server's own call timer (setTimeout) fired after
    // 1 ms past 2^31 - 1 ms. The TS client caps deadlines a minute short of that; the server's timer is a long one.
    await h.client.submit(mathTask('far-deadline', 2, 7));
    const got = await h.client.getTrajectory('far-deadline', { wait: true, deadlineMs: 30 * 24 * 3_600_000 });
    expect(got.pending).toBe(0);
    expect(got.trajectories.map((t) => t.sampleIndex)).toEqual([0, 1]);
  });

  it('maps bad unary requests to INVALID_ARGUMENT naming the field, and unknown tasks to NOT_FOUND', async () => {
    const err = (await h.client.submit({ ...mathTask('unary-bad', 1, 1), numSamples: -2 }).catch((e: unknown) => e)) as ServiceError;
    expect(err.code).toBe(status.INVALID_ARGUMENT);
    expect(err.details).toContain('task.num_samples');
    expect(err.metadata.get('rollout-field')).toEqual(['task.num_samples']);
    const missing = (await h.client.getTrajectory('nope').catch((e: unknown) => e)) as ServiceError;
    expect(missing.code).toBe(status.NOT_FOUND);
    const cancelMissing = (await h.client.cancel('nope').catch((e: unknown) => e)) as ServiceError;
    expect(cancelMissing.code).toBe(status.NOT_FOUND);
  });

  it('Cancel turns running samples into CANCELLED trajectories', async () => {
    const slow = mathTask('cancel-me', 2, 51, { limits: { maxTurns: 8, initTimeoutMs: 0, runTimeoutMs: 0, evalTimeoutMs: 0, totalTimeoutMs: 0 } });
    // A policy-free way to make the run slow: the engine hangs on the next requests until cancelled.
    h.engine.failNext(2, { kind: 'hang' });
    await h.client.submit(slow);
    await new Promise((r) => setTimeout(r, 500));
    const { cancelled } = await h.client.cancel('cancel-me');
    expect(cancelled).toBe(2);
    const got = await h.client.getTrajectory('cancel-me', { wait: true, deadlineMs: 30_000 });
    expect(got.trajectories.map((t) => t.status)).toEqual([TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED, TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED]);
    expect(got.trajectories.every((t) => t.reward === 0 && t.finishReason === 'cancelled')).toBe(true);
  });

  it('Cancel counts each sample once: a second Cancel of the same task, and one of a finished task, cancel nothing', async () => {
    const slow = mathTask('cancel-twice', 2, 52, { limits: { maxTurns: 8, initTimeoutMs: 0, runTimeoutMs: 0, evalTimeoutMs: 0, totalTimeoutMs: 0 } });
    const received = h.engine.stats().received;
    h.engine.failNext(2, { kind: 'hang' });
    await h.client.submit(slow);
    await eventually(() => h.engine.stats().received >= received + 2, 'both samples waiting on the engine', 30_000);
    // Sent together: the second arrives while the first one's samples are still being cancelled.
    const answers = await Promise.all([h.client.cancel('cancel-twice'), h.client.cancel('cancel-twice')]);
    expect(answers.map((a) => a.cancelled).sort()).toEqual([0, 2]);
    const got = await h.client.getTrajectory('cancel-twice', { wait: true, deadlineMs: 30_000 });
    expect(got.trajectories.map((t) => t.status)).toEqual([TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED, TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED]);
    expect((await h.client.cancel('cancel-twice')).cancelled).toBe(0);
    const unknown = (await h.client.cancel('never-submitted').catch((e: unknown) => e)) as ServiceError;
    expect(unknown.code).toBe(status.NOT_FOUND);
  });

  it('ListEnvironments describes math with its instance schema and tools', async () => {
    const { environments } = await h.client.listEnvironments();
    const math = environments.find((e) => e.name === 'math');
    expect(math?.tools).toEqual(['python', 'bash', 'finish']);
    expect(math?.instanceSchema).toMatchObject({ type: 'object', required: expect.arrayContaining(['problem', 'answer']) });
  });

  it('BackendService needs the admin token, and adds, lists and removes backends', async () => {
    const anonymous = new RolloutClient(h.server.address);
    const denied = (await anonymous.listBackends().catch((e: unknown) => e)) as ServiceError;
    expect(denied.code).toBe(status.UNAUTHENTICATED);
    anonymous.close();

    const before = await h.client.listBackends();
    expect(before).toHaveLength(1);
    expect(before[0]!.healthy).toBe(true);
    const added = await h.client.addBackend({ url: 'http://127.0.0.1:9/', id: 'spare', maxConcurrency: 4 });
    expect(added?.id).toBe('spare');
    expect((await h.client.listBackends()).map((b) => b.id).sort()).toEqual([before[0]!.id, 'spare'].sort());
    const badUrl = (await h.client.addBackend({ url: 'not a url' }).catch((e: unknown) => e)) as ServiceError;
    expect(badUrl.code).toBe(status.INVALID_ARGUMENT);
    expect(badUrl.details).toContain('url');
    await h.client.removeBackend('spare');
    expect((await h.client.listBackends()).map((b) => b.id)).toEqual([before[0]!.id]);
    const gone = (await h.client.removeBackend('spare').catch((e: unknown) => e)) as ServiceError;
    expect(gone.code).toBe(status.NOT_FOUND);
  });

  it('serves grpc.health.v1 and server reflection', async () => {
    const healthPkg = loadPackageDefinition(loadSync(healthProtoPath, { enums: String })) as unknown as {
      grpc: { health: { v1: { Health: new (a: string, c: ReturnType<typeof credentials.createInsecure>) => { check: (r: object, cb: (e: unknown, v: { status: string }) => void) => void; close: () => void } } } };
    };
    const health = new healthPkg.grpc.health.v1.Health(h.server.address, credentials.createInsecure());
    const res = await new Promise<{ status: string }>((resolve, reject) => health.check({ service: 'rollout.v1.RolloutService' }, (e, v) => (e ? reject(e) : resolve(v))));
    expect(res.status).toBe('SERVING');
    health.close();

    const reflectionProto = require.resolve('@grpc/reflection/build/proto/grpc/reflection/v1/reflection.proto');
    const reflPkg = loadPackageDefinition(loadSync(reflectionProto)) as unknown as {
      grpc: { reflection: { v1: { ServerReflection: new (a: string, c: ReturnType<typeof credentials.createInsecure>) => { serverReflectionInfo: (m: Metadata) => NodeJS.EventEmitter & { write: (x: object) => void; end: () => void }; close: () => void } } } };
    };
    const refl = new reflPkg.grpc.reflection.v1.ServerReflection(h.server.address, credentials.createInsecure());
    const call = refl.serverReflectionInfo(new Metadata());
    const services = await new Promise<string[]>((resolve, reject) => {
      call.on('data', (msg: { listServicesResponse?: { service: { name: string }[] } }) => resolve(msg.listServicesResponse?.service.map((s) => s.name) ?? []));
      call.on('error', reject);
      call.write({ listServices: '' });
    });
    call.end();
    refl.close();
    expect(services).toEqual(expect.arrayContaining(['rollout.v1.RolloutService', 'rollout.v1.BackendService']));
  });
});
