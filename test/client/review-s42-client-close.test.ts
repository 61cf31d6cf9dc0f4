import { Server, ServerCredentials, status, type ServerUnaryCall, type ServerWritableStream } from '@grpc/grpc-js';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { RolloutServiceService } from '../../gen/ts/rollout/v1/rollout.js';
import { eventually, within } from '../support/wait.js';

/**
 * RolloutClient.close() with calls in flight. Before, it only closed the channels, and grpc-js lets calls on a closed
 * channel run on: a getTrajectory with wait kept the trainer's process alive for its 10 min deadline, a submit waiting
 * for room (no deadline by default) and a watch for good, and their promises never settled. The server is a test double
 * (grpc-js, the real RolloutService definition) that takes the calls and never answers.
 */
const root = fileURLToPath(new URL('../../', import.meta.url));

describe('RolloutClient.close() with calls in flight (a client process against a server double that never answers)', () => {
  let server: Server | undefined;
  afterEach(() => server?.forceShutdown());

  it('rejects the unary calls CANCELLED naming close(), ends the watch, and the process exits at once', async () => {
    server = new Server();
    const open = new Set<string>();
    server.addService(RolloutServiceService, {
      getTrajectory: (call: ServerUnaryCall<unknown, unknown>) => {
        open.add('getTrajectory');
        call.on('cancelled', () => open.delete('getTrajectory'));
      },
      submit: (call: ServerUnaryCall<unknown, unknown>) => {
        open.add('submit');
        call.on('cancelled', () => open.delete('submit'));
      },
      watch: (call: ServerWritableStream<unknown, unknown>) => {
        open.add('watch');
        call.on('cancelled', () => open.delete('watch'));
      },
    } as never);
    const port = await new Promise<number>((resolve, reject) => server!.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
    const child = spawn(process.execPath, ['--import', 'tsx', 'test/support/client-close-child.ts', `127.0.0.1:${port}`], { cwd: root, stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    try {
      await eventually(() => open.size === 3, 'the three calls to reach the server', 30_000);
      const closedAt = Date.now();
      child.kill('SIGUSR2');
      // Before the fix the process was still alive (and the calls open) after this bound: the calls' own deadlines are
      // 10 min (getTrajectory) and none (submit, watch).
      expect(await within(exited, 15_000, 'the client process to exit'), out).toBe(0);
      expect(Date.now() - closedAt).toBeLessThan(15_000);
      const lines = out
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as { name: string; settled?: string; code?: number; message?: string });
      const of = (name: string) => lines.find((l) => l.name === name);
      for (const name of ['getTrajectory', 'submit', 'after']) {
        expect(of(name), out).toMatchObject({ settled: 'rejected', code: status.CANCELLED });
        expect(of(name)!.message).toContain('the RolloutClient was closed');
      }
      expect(of('watch'), out).toMatchObject({ settled: 'resolved' });
      await eventually(() => open.size === 0, 'the server to see every call cancelled', 10_000);
    } finally {
      child.kill('SIGKILL');
    }
  }, 60_000);
});
