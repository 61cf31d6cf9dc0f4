import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { credentials, loadPackageDefinition } from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import { protoPath as healthProtoPath } from 'grpc-health-check';
import { afterEach, describe, expect, it } from 'vitest';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

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

const dirs: string[] = [];
const harnesses: ServerHarness[] = [];
afterEach(async () => {
  await Promise.all(harnesses.splice(0).map((h) => h.close()));
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

const bulky = (id: string, i: number) => mathTask(id, 1, 300 + i, { metadata: { pad: 'x'.repeat(15_000) } });

describe('a journal that reached journal.maxBytes and was then compacted', () => {
  it('turns rollout.admission back to SERVING once compaction made room (a balancer that routes by it would never send the submit that clears it)', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'journal-full-'));
    dirs.push(dir);
    const h = await startServerHarness({ config: { journal: { dir, maxBytes: 1 << 20 }, retainFinishedTasks: 0 } });
    harnesses.push(h);
    // retryRejectedForMs 0: the refusal this test waits for is answered at once (the client's default retries it for 60 s).
    const session = h.client.openSession({ sessionId: 'slow-acker', autoAck: false, retryRejectedForMs: 0 });
    const got: Trajectory[] = [];
    const reading = (async () => {
      try {
        for await (const t of session.trajectories()) got.push(t);
      } catch {
        // ends with the server
      }
    })();
    let refused: unknown;
    const accepted: string[] = [];
    for (let i = 0; i < 400 && !refused; i++) {
      try {
        await session.submit(bulky(`b-${i}`, i));
        accepted.push(`b-${i}`);
      } catch (err) {
        refused = err;
      }
    }
    expect(String((refused as Error | undefined)?.message)).toMatch(/the journal is full/);
    expect(await admissionHealth(h.server.address)).toBe('NOT_SERVING');
    // The trainer catches up: every trajectory received and acked ...
    await eventually(() => got.length === accepted.length, 'every accepted trajectory', 60_000);
    session.ack(got.map((t) => ({ taskId: t.taskId, sampleIndex: t.sampleIndex })));
    await eventually(() => h.server.journal!.usedBytes() > 0, 'ack written', 5_000);
    await new Promise((r) => setTimeout(r, 200));
    // ... and the background compaction runs (what the once-a-minute timer calls).
    const dropped = await h.server.journal!.compact();
    expect(dropped).toBe(accepted.length);
    expect(h.server.journal!.usedBytes()).toBeLessThan(1 << 19);
    expect(await admissionHealth(h.server.address)).toBe('SERVING');
    session.close();
    void reading;
  }, 120_000);
});
