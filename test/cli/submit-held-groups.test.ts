import { spawn } from 'node:child_process';
import { createReadStream, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Server, ServerCredentials, type ServerDuplexStream } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutResponse, RolloutServiceService, Trajectory, TrajectoryStatus, type RolloutRequest } from '../../gen/ts/rollout/v1/rollout.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

/** Tokens in each sample the server double sends: with GROUP samples, a group is ~180 MB as decoded JS arrays. */
const TOKENS = 40_000;
const GROUP = 192;
/** The CLI's old-space heap in this test: far below one held group as objects, far above one sample. */
const HEAP_MB = 96;

/** Long samples (TOKENS each), all of them at once (what a real server does for a group of long samples that finish together). */
const longGroup = (n: number): number[] => [...Array(n).keys()];

/**
 * TEST DOUBLE: a Rollout server that accepts every task and streams, at once, a COMPLETED trajectory for each sample
 * index `indices` gives for it (a faulty server's may be out of range), `tokens` long.
 */
function startRolloutServerDouble(indices: (numSamples: number) => number[], tokens: number): Promise<{ address: string; server: Server }> {
  const server = new Server();
  server.addService(RolloutServiceService, {
    rollout: (call: ServerDuplexStream<RolloutRequest, RolloutResponse>) => {
      call.on('data', (req: RolloutRequest) => {
        const kind = req.kind;
        if (kind?.$case === 'open') call.write(RolloutResponse.fromPartial({ kind: { $case: 'opened', value: { sessionId: kind.value.sessionId } } }));
        if (kind?.$case !== 'task') return;
        const spec = kind.value;
        call.write(RolloutResponse.fromPartial({ kind: { $case: 'accepted', value: { taskId: spec.taskId, numSamples: spec.numSamples } } }));
        for (const i of indices(spec.numSamples)) {
          const trajectory = Trajectory.fromPartial({
            taskId: spec.taskId,
            groupId: spec.groupId,
            sampleIndex: i,
            environment: spec.environment,
            status: TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
            reward: 1,
            metadata: spec.metadata,
            responseTokenIds: new Array<number>(tokens).fill(7),
            responseMask: new Array<number>(tokens).fill(1),
            responseLogprobs: new Array<number>(tokens).fill(-0.5),
          });
          call.write(RolloutResponse.fromPartial({ kind: { $case: 'trajectory', value: trajectory } }));
        }
      });
      call.on('end', () => call.end());
      call.on('error', () => undefined);
    },
    submit: () => undefined,
  } as never);
  return new Promise((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, port) => (err ? reject(err) : resolve({ address: `127.0.0.1:${port}`, server }))),
  );
}

describe('rollout submit holds a group waiting to be whole on disk, not in memory', () => {
  let dir: string;
  let double: { address: string; server: Server };
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rollout-held-'));
    double = await startRolloutServerDouble(longGroup, TOKENS);
  });
  afterAll(() => {
    double?.server.forceShutdown();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it(`writes a group of ${GROUP} long samples under a ${HEAP_MB} MB heap, whole and in sample order, and leaves no held file behind`, async () => {
    const dataset = join(dir, 'long.jsonl');
    writeFileSync(dataset, JSON.stringify({ problem: 'What is 1 + 1?', answer: '2' }) + '\n');
    const output = join(dir, 'long.out.jsonl');
    const child = spawn(
      process.execPath,
      [`--max-old-space-size=${HEAP_MB}`, 'bin/rollout.js', 'submit', '--dataset', dataset, '--environment', 'math', '--num-samples', String(GROUP), '--server', double.address, '--output', output],
      { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' } },
    );
    let log = '';
    child.stdout.on('data', (d: Buffer) => (log += d.toString()));
    child.stderr.on('data', (d: Buffer) => (log += d.toString()));
    const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
    expect(code, log.slice(-2000)).toBe(0);

    const indices: number[] = [];
    for await (const line of createInterface({ input: createReadStream(output) })) {
      if (line === '') continue;
      const record = JSON.parse(line) as { sampleIndex?: number; responseTokenIds?: number[]; metadata?: Record<string, string> };
      expect(record.responseTokenIds).toHaveLength(TOKENS);
      expect(record.metadata?.attempt).toBe('1');
      indices.push(record.sampleIndex ?? 0);
    }
    expect(indices).toEqual([...Array(GROUP).keys()]);
    expect(readdirSync(dir).sort()).toEqual(['long.jsonl', 'long.out.jsonl']);
  }, 180_000);

  it('drops a sample whose index is outside the group (a faulty server), naming it: the group is whole only with its own samples', async () => {
    const faulty = await startRolloutServerDouble((n) => [n, 0, n + 7, 1], 4);
    try {
      const dataset = join(dir, 'faulty.jsonl');
      writeFileSync(dataset, JSON.stringify({ problem: 'What is 2 + 2?', answer: '4' }) + '\n');
      const output = join(dir, 'faulty.out.jsonl');
      const child = spawn(process.execPath, ['bin/rollout.js', 'submit', '--dataset', dataset, '--environment', 'math', '--num-samples', '2', '--server', faulty.address, '--output', output], {
        cwd: root,
        stdio: ['ignore', 'pipe', 'pipe'],
        env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' },
      });
      let log = '';
      child.stdout.on('data', (d: Buffer) => (log += d.toString()));
      child.stderr.on('data', (d: Buffer) => (log += d.toString()));
      const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
      expect(code, log).toBe(0);
      const indices: number[] = [];
      for await (const line of createInterface({ input: createReadStream(output) })) if (line !== '') indices.push((JSON.parse(line) as { sampleIndex?: number }).sampleIndex ?? 0);
      expect(indices).toEqual([0, 1]);
      // Named by the client session itself (since the TS client checks what a server sends against what it is owed, it
      // never reaches submit's own check): a RolloutProtocolWarning on stderr.
      expect(log).toMatch(/RolloutProtocolWarning: rollout server .* sent trajectory of task \S+ with sample_index 2, outside its 2 samples: ignored, a faulty server/);
    } finally {
      faulty.server.forceShutdown();
    }
  });
});
