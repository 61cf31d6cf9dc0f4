import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { status, type ServiceError } from '@grpc/grpc-js';
import { RolloutRequest } from '../../gen/ts/rollout/v1/rollout.js';
import { rawRollout } from '../support/raw-rollout.js';
import { eventually } from '../support/wait.js';
import { probeTask, startProbe, type ProbeHarness } from '../support/probe-environment.js';

let h: ProbeHarness;
beforeAll(async () => {
  h = await startProbe();
});
afterAll(async () => h?.close());

const bytes = (r: RolloutRequest): Uint8Array => RolloutRequest.encode(r).finish();

// Regression (pipeline review, 2026-12-02): a cancel with an empty task_id was dropped in silence on the stream and
// answered NOT_FOUND by the unary call. (A cancel of an unknown id stays unanswered on the stream: the task may simply
// have finished and been forgotten; the unary call says NOT_FOUND.)
describe('cancel of a task id that names nothing', () => {
  it('on the stream, a cancel with an empty task_id is rejected naming task_id; one of an unknown id is not an error', async () => {
    const raw = rawRollout(h.server.address);
    raw.send(bytes({ kind: { $case: 'open', value: { sessionId: '', resume: false, stageEvents: false } } }));
    raw.send(bytes({ kind: { $case: 'cancel', value: { taskId: '' } } }));
    raw.send(bytes({ kind: { $case: 'cancel', value: { taskId: 'no-such-task' } } }));
    // A real task after them, so we know the cancels were read and handled.
    const spec = probeTask('after-cancels', {});
    raw.send(bytes({ kind: { $case: 'task', value: { numSamples: 1, groupId: '', metadata: {}, includeMessages: false, ...spec } as never } }));
    await eventually(() => raw.received.some((r) => r.kind?.$case === 'accepted'), 'the task accepted');
    raw.end();
    const responses = await raw.responses;
    const rejected = responses.flatMap((r) => (r.kind?.$case === 'rejected' ? [r.kind.value] : []));
    expect(rejected.map((r) => `${r.taskId}|${r.field}`), `responses: ${responses.map((r) => r.kind?.$case).join(',')}`).toEqual(['|task_id']);
    raw.client.close();
  });

  it('unary Cancel with an empty task_id is INVALID_ARGUMENT naming task_id (bad input), not NOT_FOUND', async () => {
    const err = (await h.client.cancel('').catch((e: unknown) => e)) as ServiceError;
    expect(err.code, err.details).toBe(status.INVALID_ARGUMENT);
    expect(err.metadata.get('rollout-field')).toEqual(['task_id']);
  });
});
