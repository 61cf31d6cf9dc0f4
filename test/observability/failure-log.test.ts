import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { describeError, RolloutError } from '../../src/errors.js';
import { VllmHttpError } from '../../src/backends/vllm-client.js';
import { FailureLog } from '../../src/observability/failure-log.js';
import { createLogger } from '../../src/observability/logger.js';
import { Role, Trajectory, TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';

function capture() {
  const lines: Array<Record<string, unknown>> = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const l of chunk.toString('utf8').split('\n')) if (l) lines.push(JSON.parse(l) as Record<string, unknown>);
      done();
    },
  });
  return { logger: createLogger({ level: 'info', destination: sink }), lines };
}

const failed = (sampleIndex: number, status = TrajectoryStatus.TRAJECTORY_STATUS_BACKEND_ERROR): Trajectory =>
  Trajectory.fromPartial({
    taskId: 't',
    sampleIndex,
    status,
    error: 'backend_error: boom',
    turns: [
      { role: Role.ROLE_ASSISTANT, start: 0, end: 3, backend: 'gpu-1' },
      { role: Role.ROLE_TOOL, start: 3, end: 5 },
      { role: Role.ROLE_ASSISTANT, start: 5, end: 9, backend: 'gpu-2' },
      { role: Role.ROLE_TOOL, start: 9, end: 12 },
    ],
  });

describe('FailureLog', () => {
  it('writes one line per failed trajectory with task, sample, status, backend of the last sampled turn and cause', () => {
    const { logger, lines } = capture();
    const log = new FailureLog(logger);
    log.record(failed(3));
    log.record(Trajectory.fromPartial({ taskId: 'ok', status: TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED }));
    log.record(Trajectory.fromPartial({ taskId: 'cut', status: TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED }));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ msg: 'trajectory failed', task: 't', sample: 3, status: 'BACKEND_ERROR', backend: 'gpu-2', cause: 'backend_error: boom', level: 40 });
    expect(lines[0]).not.toHaveProperty('suppressed');
  });

  it('lets a burst through, then linesPerSecond, and reports how many it dropped on the next line written', () => {
    const { logger, lines } = capture();
    let now = 0;
    const log = new FailureLog(logger, { linesPerSecond: 2, burst: 3, now: () => now });
    for (let i = 0; i < 10; i++) log.record(failed(i));
    expect(lines.map((l) => l.sample)).toEqual([0, 1, 2]);
    expect(log.suppressed).toBe(7);
    now += 500; // one token back
    log.record(failed(10));
    log.record(failed(11));
    expect(lines.map((l) => l.sample)).toEqual([0, 1, 2, 10]);
    expect(lines[3]!.suppressed).toBe(7);
    now += 60_000; // refills to the burst, not beyond
    for (let i = 20; i < 25; i++) log.record(failed(i));
    expect(lines.slice(4).map((l) => [l.sample, l.suppressed])).toEqual([[20, 1], [21, undefined], [22, undefined]]);
  });
});

describe('describeError', () => {
  it('walks the cause chain, without repeating what was already said', () => {
    const err = new RolloutError('backend_error', 'vLLM http://gpu:8000 answered HTTP 400', { cause: new VllmHttpError(400, '{"error":{"message":"bad"}}') });
    expect(describeError(err)).toBe('backend_error: vLLM http://gpu:8000 answered HTTP 400: {"error":{"message":"bad"}}');
    const same = RolloutError.from(new Error('ENOSPC: no space left on device'), 'sandbox_error');
    expect(describeError(same)).toBe('sandbox_error: ENOSPC: no space left on device');
    const loop = new Error('a', { cause: new Error('b') });
    (loop.cause as Error).cause = loop;
    expect(describeError(loop)).toBe('a: b');
  });

  it('bounds the text in UTF-8 bytes, never cutting a surrogate pair, and repairs lone surrogates', () => {
    for (let pad = 0; pad < 4; pad++) {
      const text = describeError(new Error(`${'x'.repeat(pad)}${'😀'.repeat(1000)}`), 2048);
      expect(Buffer.byteLength(text)).toBeLessThanOrEqual(2048);
      expect(Buffer.byteLength(text)).toBeGreaterThan(2040);
      expect(Buffer.from(text, 'utf8').toString('utf8')).toBe(text);
      expect(text.endsWith('😀…')).toBe(true);
    }
    expect(describeError(new Error('half \uD83D pair \uDE00 end'))).toBe('half \uFFFD pair \uFFFD end');
  });
});
