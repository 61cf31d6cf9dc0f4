import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, type Harness } from '../support/harness.js';
import { ROOT, type PythonRun, type PythonRuntime } from './runtimes.js';

/**
 * The venv of the adapter tests (./scripts/setup.sh makes it): verl 0.9.1 and what its agent-loop module imports on
 * CPU (torch, transformers, hydra, ray, ...), plus the client's grpcio/protobuf and pytest. verl's adapter is tested
 * against verl's real classes here; SkyRL, NeMo-RL and slime do not install on this machine (Python 3.11; see
 * docs/trainers/) and are tested against their field contracts, in the same venv.
 */
const ADAPTERS: PythonRuntime = {
  name: 'verl 0.9.1 (adapter tests)',
  venv: '.venvs/verl',
  requirements: 'python/tests/adapters/verl-requirements.txt',
  protobuf: /^7\./,
  grpcio: /^1\.8\d\./,
};

/** Temperature that makes the fake engine (a test double of vLLM's HTTP API) fail: the adapters' failure path. */
const FAILING_TEMPERATURE = 0.125;

describe('the trainer adapters (verl, SkyRL, NeMo-RL, slime), over a real server', () => {
  let h: Harness;
  beforeAll(async () => {
    if (!existsSync(`${ROOT}${ADAPTERS.venv}/bin/python`)) throw new Error(`${ADAPTERS.venv} missing: run ./scripts/setup.sh`);
    h = await startHarness({}, {
      inject: ({ body }) => (body.temperature === FAILING_TEMPERATURE ? { kind: 'status', status: 500, message: 'injected by adapters.test.ts' } : undefined),
    });
  });
  afterAll(async () => h?.close());

  it('pass their pytest suite (python/tests/adapters)', async () => {
    const { code, stdout, stderr } = await pytest(h.server.address);
    expect(code, `${stdout}\n${stderr}`).toBe(0);
    expect(stdout).toMatch(/\d+ passed/);
    expect(stdout).not.toMatch(/skipped|xfail/);
    console.log(`python/tests/adapters: ${stdout.trim().split('\n').at(-1)}`);
  }, 600_000);
});

/** Runs the adapters' pytest suite in their venv from the repo root, pointed at `target`. */
async function pytest(target: string): Promise<PythonRun> {
  // pytest's own tmp_path root (it keeps the last three runs' directories otherwise) and torch's cache: this run's,
  // removed after it.
  const work = await mkdtemp(join(tmpdir(), 'rollout-pytest-'));
  return new Promise<PythonRun>((resolve, reject) => {
    const args = ['-m', 'pytest', '-q', '-p', 'no:cacheprovider', `--basetemp=${join(work, 'pytest')}`, '-W', 'error::pytest.PytestUnraisableExceptionWarning', 'python/tests/adapters'];
    const child = spawn(`${ROOT}${ADAPTERS.venv}/bin/python`, args, {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'pipe'],
      // torch (imported by verl) makes its inductor cache directory at import: in this run's work dir, not in TMPDIR.
      env: { ...process.env, ROLLOUT_TARGETS: target, ROLLOUT_ADAPTER_TESTS: '1', TORCHINDUCTOR_CACHE_DIR: join(work, 'torchinductor') },
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  }).finally(() => rm(work, { recursive: true, force: true }));
}
