import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { NODE_FLAGS } from '../../src/cli/node-flags.js';
import { healthStatuses } from '../support/health.js';
import { eventually, within } from '../support/wait.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

/** A stack trace line. */
const STACK = /\n\s+at .*\.(ts|js):\d+/;

/** A port nothing listens on now (the kernel's pick for port 0, released). */
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** `rollout serve ...args` until it exits, or until it listens (then SIGTERMed). */
async function serve(args: string[]): Promise<{ code: number | null; out: string; listened: boolean }> {
  const child = spawn(process.execPath, [...NODE_FLAGS, 'bin/rollout.js', 'serve', ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' } });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  let gone = false;
  void exited.then(() => (gone = true));
  try {
    await eventually(() => gone || out.includes('rollout server listening on '), 'the server to listen or exit', 90_000);
    const listened = out.includes('rollout server listening on ');
    if (listened) child.kill('SIGTERM');
    return { code: await within(exited, 60_000, 'the server to exit'), out, listened };
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
}

describe('`serve` start-up mistakes are named, not misreported', () => {
  // Regression: the metrics endpoint bound the port first, and the gRPC bind then failed "the port is in use" (exit 1),
  // as if another program held it.
  it('--metrics-port equal to --port: one line naming both, exit 2, nothing started', async () => {
    const port = await freePort();
    const r = await serve(['--port', String(port), '--metrics-port', String(port)]);
    expect({ code: r.code, stack: STACK.test(r.out), listened: r.listened }).toEqual({ code: 2, stack: false, listened: false });
    expect(r.out).toBe(`rollout: metrics.port ${port} is the gRPC port (port): give the metrics endpoint a port of its own\n`);
  }, 180_000);

  it('the same port number on another address is no clash: the server starts', async () => {
    const port = await freePort();
    const r = await serve(['--port', String(port), '--metrics-port', String(port), '--metrics-host', '127.0.0.2']);
    expect({ code: r.code, listened: r.listened }, r.out).toEqual({ code: 0, listened: true });
    expect(r.out).toContain(`metrics on http://127.0.0.2:${port}/metrics`);
  }, 180_000);

  // Regression: with stdout's reader gone, the "listening" line's EPIPE was thrown: a stack trace and exit 1, right
  // after the server had started.
  it('stdout nobody reads (`serve | true`): the server keeps serving, then drains on SIGTERM, exit 0, no stack trace', async () => {
    const port = await freePort();
    const child = spawn(process.execPath, [...NODE_FLAGS, 'bin/rollout.js', 'serve', '--port', String(port)], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'info' } });
    try {
      child.stdout.destroy(); // the reader is gone before the server writes anything
      let err = '';
      child.stderr.on('data', (d: Buffer) => (err += d.toString()));
      const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
      let gone = false;
      void exited.then(() => (gone = true));
      const serving = async (): Promise<boolean> => gone || (await healthStatuses(`127.0.0.1:${port}`).then((s) => s[''] === 'SERVING', () => false));
      await eventually(serving, 'the server to serve', 90_000);
      // Still serving a moment on: its "listening" line and logs went to the broken pipe already.
      expect(gone, err).toBe(false);
      expect((await healthStatuses(`127.0.0.1:${port}`))['']).toBe('SERVING');
      child.kill('SIGTERM');
      expect(await within(exited, 60_000, 'the server to exit'), err).toEqual({ code: 0, signal: null });
      expect(STACK.test(err), err).toBe(false);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  }, 180_000);
});
