import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { makeTestCerts, type TestCerts } from '../support/test-certs.js';
import { PYTHON_RUNTIMES, ROOT, runPython } from './runtimes.js';

const TOKEN = 'python-trainer-token-4d2c';
const CLIENT_VENV = PYTHON_RUNTIMES[0]!;

describe('the Python example trainer over mTLS with a bearer token', () => {
  let certs: TestCerts;
  let h: ServerHarness;
  let dir: string;
  let tokenFile: string;
  beforeAll(async () => {
    if (!existsSync(`${ROOT}${CLIENT_VENV.venv}/bin/python`)) throw new Error(`${CLIENT_VENV.venv} missing: run ./scripts/setup.sh`);
    certs = await makeTestCerts();
    dir = await mkdtemp(join(tmpdir(), 'rollout-py-token-'));
    tokenFile = join(dir, 'token');
    await writeFile(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
    h = await startServerHarness({
      config: { auth: { token: TOKEN }, tls: { certFile: certs.serverCertFile, keyFile: certs.serverKeyFile, clientCaFile: certs.caFile, requireClientCert: true } },
    });
  }, 60_000);
  afterAll(async () => {
    await h?.close();
    await certs?.remove();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  const base = (seed: number): string[] => ['examples/python/train_loop.py', '--target', h.server.address, '--groups', '3', '--group-size', '2', '--seed', String(seed), '--timeout', '120'];
  const tls = (): string[] => ['--ca', certs.caFile, '--client-cert', certs.clientCertFile, '--client-key', certs.clientKeyFile];

  it('receives every trajectory over TLS with its client certificate and the token from a file', async () => {
    const { code, stdout, stderr } = await runPython(CLIENT_VENV, [...base(41), ...tls(), '--token-file', tokenFile]);
    expect(code, `${stderr}\n${stdout}`).toBe(0);
    const summary = JSON.parse(stdout.trim().split('\n').at(-1)!) as { accepted: number; trajectories: number; missing: number; duplicated: number };
    expect(summary).toMatchObject({ accepted: 3, trajectories: 6, missing: 0, duplicated: 0 });
  }, 120_000);

  it('is refused UNAUTHENTICATED over TLS without the token', async () => {
    const { code, stderr } = await runPython(CLIENT_VENV, [...base(42), ...tls()]);
    expect(code).not.toBe(0);
    expect(stderr).toMatch(/UNAUTHENTICATED/);
  }, 120_000);
});
