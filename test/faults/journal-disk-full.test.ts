import { execFileSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { credentials, status, type ServiceError } from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import { loadPackageDefinition } from '@grpc/grpc-js';
import { protoPath as healthProtoPath } from 'grpc-health-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { spawnServe, type ServeProcess } from '../support/rollout-process.js';
import { eventually, within } from '../support/wait.js';

type HealthClient = { check: (r: object, cb: (e: unknown, v: { status: string }) => void) => void; close: () => void };
const healthPkg = loadPackageDefinition(loadSync(healthProtoPath, { enums: String })) as unknown as {
  grpc: { health: { v1: { Health: new (a: string, c: ReturnType<typeof credentials.createInsecure>) => HealthClient } } };
};

async function admissionHealth(address: string): Promise<string> {
  const health = new healthPkg.grpc.health.v1.Health(address, credentials.createInsecure());
  try {
    return (await new Promise<{ status: string }>((resolve, reject) => health.check({ service: 'rollout.admission' }, (e, v) => (e ? reject(e) : resolve(v))))).status;
  } finally {
    health.close();
  }
}

/** Each task carries ~15 KiB of metadata (echoed in its trajectory), so a 1 MiB disk fills after a few dozen. */
const bulky = (id: string, i: number) => mathTask(id, 1, 200 + i, { metadata: { pad: 'x'.repeat(15_000) } });

// Mounting a small tmpfs needs root (CI runs as root; so does this VM).
describe.skipIf(process.getuid?.() !== 0)('a journal whose disk fills up', () => {
  let engine: FakeVllmEngine;
  let mount: string;
  const servers: ServeProcess[] = [];

  beforeAll(async () => {
    engine = await FakeVllmEngine.start({ tokenizer: (await loadQwen3()).tokenizer, tokenLatencyMs: 0 });
    mount = await mkdtemp(join(tmpdir(), 'rollout-journal-full-'));
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', mount]);
  });
  afterAll(async () => {
    for (const s of servers) s.child.kill('SIGKILL');
    await Promise.all(servers.map((s) => s.exited));
    await engine.close();
    execFileSync('umount', [mount]);
    await rm(mount, { recursive: true, force: true });
  });

  const serve = async (): Promise<ServeProcess> => {
    const s = await spawnServe(['--backend', engine.url, '--model', engine.model, '--journal-dir', join(mount, 'journal')]);
    servers.push(s);
    return s;
  };

  it('fails admission with RESOURCE_EXHAUSTED naming the journal, lets accepted work finish, and stays readable after a restart', async () => {
    const first = await serve();
    const client = new RolloutClient(first.address);
    expect(await admissionHealth(first.address)).toBe('SERVING');
    const accepted: string[] = [];
    let refused: ServiceError | undefined;
    for (let i = 0; i < 400 && !refused; i++) {
      try {
        await within(client.submit(bulky(`full-${i}`, i)), 60_000, `submit ${i} (server output:\n${first.output().slice(-3000)})`);
        accepted.push(`full-${i}`);
      } catch (err) {
        refused = err as ServiceError;
      }
    }
    expect(refused, 'the disk never filled').toBeDefined();
    expect(refused!.code).toBe(status.RESOURCE_EXHAUSTED);
    expect(refused!.details).toMatch(/^the journal's disk is full: \d+ bytes free on the file system of .*journal \(the write failed: /);
    expect(accepted.length).toBeGreaterThan(5);
    // Said in the logs and in admission's health.
    await eventually(() => first.logs('journal full: admission fails until space is freed').length === 1, 'the journal-full log line', 30_000);
    expect(await admissionHealth(first.address)).toBe('NOT_SERVING');
    // Work already accepted continues to a truthful end.
    for (const id of accepted) {
      const got = await client.getTrajectory(id, { wait: true, deadlineMs: 60_000 });
      expect(got.trajectories.map((t) => t.status), `${id}\n${first.output().slice(-3000)}`).toEqual([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED]);
    }
    client.close();
    first.child.kill('SIGKILL');
    await first.exited;

    // Restarted on the same (still full) disk: the journal opens, every acknowledged acceptance is in it.
    const second = await serve();
    await eventually(() => second.logs('recovered from the journal').length > 0, 'the recovery report', 30_000);
    expect(second.logs('recovered from the journal')[0]).toMatchObject({ tasks: accepted.length, invalidTasks: 0 });
    const client2 = new RolloutClient(second.address);
    try {
      expect((await client2.submit(bulky(accepted[0]!, 0))).duplicate).toBe(true);
      for (const id of accepted) {
        const got = await client2.getTrajectory(id, { wait: true, deadlineMs: 60_000 });
        expect(got.trajectories.map((t) => t.status), id).toEqual([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED]);
      }
      // Still full. LMDB reuses the pages its own transactions freed, so a few small tasks may still fit in the file
      // the first server left; past that, new tasks are refused the same way, never accepted into a journal that
      // cannot hold them — and every task accepted meanwhile runs to its end.
      const later: string[] = [];
      let again: ServiceError | undefined;
      for (let i = 0; i < 100 && !again; i++) {
        try {
          await within(client2.submit(bulky(`after-restart-${i}`, 500 + i)), 60_000, `submit after restart ${i}`);
          later.push(`after-restart-${i}`);
        } catch (err) {
          again = err as ServiceError;
        }
      }
      expect(again, 'the restarted server accepted 100 bulky tasks on a full disk').toBeDefined();
      expect(again!.code).toBe(status.RESOURCE_EXHAUSTED);
      expect(again!.details).toMatch(/the journal's disk is full/);
      for (const id of later) {
        const got = await client2.getTrajectory(id, { wait: true, deadlineMs: 60_000 });
        expect(got.trajectories.map((t) => t.status), id).toEqual([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED]);
      }
    } finally {
      client2.close();
    }
  }, 240_000);
});
