import { status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutRequest, TaskSpec, TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { Environment } from '../../src/environments/types.js';
import type { JsonObject } from '../../src/environments/json.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { rawRollout } from '../support/raw-rollout.js';
import { eventually } from '../support/wait.js';

type Kind = 'bigint' | 'cycle' | 'deep' | 'huge' | 'throws' | 'ok';

/** A test environment whose evaluate returns the report its instance asks for (hostile ones included). */
const hostileReports: Environment<{ kind: Kind }> = {
  name: 'hostile-report',
  description: 'evaluate returns a report that cannot be encoded, is too large, or is fine',
  instanceSchema: { type: 'object' },
  validate: (x) => ({ kind: (x as { kind: Kind }).kind }),
  init: async () => ({ messages: [{ role: 'user', content: 'Say done.' }] }),
  tools: () => [],
  evaluate: async ({ instance }) => {
    let report: unknown;
    switch (instance.kind) {
      case 'bigint':
        report = { big: 10n };
        break;
      case 'cycle': {
        const cyclic: Record<string, unknown> = {};
        cyclic.self = cyclic;
        report = cyclic;
        break;
      }
      case 'deep': {
        let v: unknown = 1;
        for (let i = 0; i < 40; i++) v = { v };
        report = v;
        break;
      }
      case 'huge':
        report = { log: 'x'.repeat(400_000) };
        break;
      case 'throws':
        return {
          reward: 1,
          get details(): Record<string, number> {
            throw new Error('details exploded');
          },
          report: {},
        };
      default:
        report = { fine: true };
    }
    return { reward: 1, details: { correct: 1 }, report: report as JsonObject };
  },
};

const task = (taskId: string, kind: Kind): Uint8Array =>
  RolloutRequest.encode({ kind: { $case: 'task', value: TaskSpec.fromPartial({ taskId, environment: 'hostile-report', numSamples: 1, instance: { kind } }) } }).finish();
const open = (sessionId: string, resume: boolean): Uint8Array =>
  RolloutRequest.encode({ kind: { $case: 'open', value: { sessionId, resume, stageEvents: false } } }).finish();
const trajectoriesOf = (responses: { kind?: { $case: string; value: unknown } }[]): Trajectory[] =>
  responses.flatMap((r) => (r.kind?.$case === 'trajectory' ? [r.kind.value as Trajectory] : []));

describe('every trajectory is wire-safe before it is queued', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({
      engine: { policy: () => 'done' },
      sandboxes: new NullSandboxDriver(),
      registry: defaultRegistry().register(hostileReports),
      // 256 KiB messages: a 400 KB report cannot fit.
      config: { maxMessageBytes: 256 * 1024 },
    });
  });
  afterAll(async () => h?.close());

  it('degrades unencodable, too deep, too large and throwing reports to ENVIRONMENT_ERROR; the stream and a resume both work', async () => {
    const kinds: Kind[] = ['bigint', 'cycle', 'deep', 'huge', 'throws', 'ok'];
    const first = rawRollout(h.server.address);
    first.send(open('wire-safe-1', false));
    for (const kind of kinds) first.send(task(`ws-${kind}`, kind));
    await eventually(() => trajectoriesOf(first.received).length === kinds.length, 'every trajectory', 20_000);
    // Gone without acking: every trajectory is owed again on resume.
    first.cancel();
    first.client.close();

    const byKind = new Map(trajectoriesOf(first.received).map((t) => [t.taskId.slice(3) as Kind, t]));
    expect(byKind.get('ok')!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
    expect(byKind.get('ok')!.evalReport).toEqual({ fine: true });
    for (const kind of ['bigint', 'cycle', 'deep', 'huge', 'throws'] as const) {
      const t = byKind.get(kind)!;
      expect(t.status, `${kind}: ${t.error}`).toBe(TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR);
      expect(t.evalReport, kind).toBeUndefined();
    }
    expect(byKind.get('bigint')!.error).toContain('bigint');
    expect(byKind.get('cycle')!.error).toContain('cycle');
    expect(byKind.get('deep')!.error).toContain('nested deeper');
    expect(byKind.get('huge')!.error).toContain('over the');
    expect(byKind.get('throws')!.error).toContain('details exploded');

    const second = rawRollout(h.server.address);
    second.send(open('wire-safe-1', true));
    second.send(task('ws-after', 'ok'));
    second.end();
    const resumed = await second.responses;
    expect(await second.status).toBe(status.OK);
    second.client.close();
    expect(trajectoriesOf(resumed).map((t) => t.taskId).sort()).toEqual([...kinds.map((k) => `ws-${k}`), 'ws-after'].sort());
  });
});
