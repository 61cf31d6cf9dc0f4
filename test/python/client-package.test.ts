import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, type Harness } from '../support/harness.js';
import { ROOT } from './runtimes.js';

/**
 * The installable Python client (python/, distribution rollout-service-client): built as an sdist and a wheel from the
 * sdist (so the stubs that hatch_build.py adds must travel inside the sdist), installed into each test venv
 * ./scripts/setup.sh made (python/client-tests/), and its pytest suite (python/tests) run there against real servers
 * it starts itself (`rollout serve --fake-engine`), including a kill -9 of one of two servers.
 */
interface Leg {
  venv: string;
  protobuf: RegExp;
  grpcio: RegExp;
  /** pytest arguments selecting the tests run on this leg (default: the whole suite). */
  select?: readonly string[];
}

/**
 * What the runtimes can change is the client's use of them: the stubs' import, messages built, encoded and decoded
 * (well-formed, hostile and undecodable bytes), the channel, streams, credentials. The newest and the oldest supported
 * runtimes run the whole suite; the two between run the tests that exercise those (every file but the ones whose
 * subject is the client's own flow control, acks and pauses, and the two server-kill cases of test_client.py, which
 * take 12 s each). The suite runs serially in CI: the whole suite on every leg was 11 of CI's minutes.
 */
const RUNTIME_SURFACE: readonly string[] = [
  'python/tests/test_client.py',
  'python/tests/test_results.py',
  'python/tests/test_advantages.py',
  'python/tests/test_auth.py',
  'python/tests/test_review_s37_hostile_server.py',
  'python/tests/test_review_s38_receive_path.py',
  'python/tests/test_review_s39_client_hardening.py',
  'python/tests/test_review_s40_client.py',
  '-k',
  'not killed and not restarted',
];

const LEGS: Leg[] = [
  { venv: '.venvs/pyclient-protobuf-7', protobuf: /^7\./, grpcio: /^1\.85\./ },
  { venv: '.venvs/pyclient-protobuf-6', protobuf: /^6\.33\./, grpcio: /^1\.76\./, select: RUNTIME_SURFACE },
  { venv: '.venvs/pyclient-protobuf-5', protobuf: /^5\.29\./, grpcio: /^1\.68\./, select: RUNTIME_SURFACE },
  { venv: '.venvs/pyclient-protobuf-4', protobuf: /^4\.21\./, grpcio: /^1\.51\./ },
];
const UV = `${ROOT}.venvs/uv/bin/uv`;

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function run(command: string, args: readonly string[], env: Record<string, string> = {}): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, UV_PYTHON_DOWNLOADS: 'never', ...env } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

async function ok(command: string, args: readonly string[], env: Record<string, string> = {}): Promise<string> {
  const r = await run(command, args, env);
  if (r.code !== 0) throw new Error(`${command} ${args.join(' ')} exited ${r.code}:\n${r.stderr}\n${r.stdout}`);
  return r.stdout;
}

const WHERE = 'import json, google.protobuf, grpc, rollout_client, rollout.v1.rollout_pb2 as pb; print(json.dumps({"protobuf": google.protobuf.__version__, "grpcio": grpc.__version__, "client": rollout_client.__file__, "stubs": pb.__file__}))';

describe('the Python client package', () => {
  let dist: string;
  let wheel: string;
  beforeAll(async () => {
    for (const { venv } of LEGS) if (!existsSync(`${ROOT}${venv}/bin/python`)) throw new Error(`${venv} missing: run ./scripts/setup.sh`);
    dist = await mkdtemp(join(tmpdir(), 'rollout-pyclient-dist-'));
    await ok(UV, ['build', '-q', 'python', '--out-dir', dist]);
    const files = await readdir(dist);
    expect(files.some((f) => f.endsWith('.tar.gz'))).toBe(true);
    wheel = join(dist, files.find((f) => f.endsWith('.whl'))!);
  }, 300_000);
  afterAll(async () => {
    if (dist) await rm(dist, { recursive: true, force: true });
  });

  it('builds a wheel (from its sdist) holding the client and the generated stubs of gen/python', async () => {
    const list = await ok(`${ROOT}${LEGS[0]!.venv}/bin/python`, ['-c', 'import sys, zipfile; print("\\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))', wheel]);
    const names = list.trim().split('\n');
    for (const f of ['rollout_client/__init__.py', 'rollout_client/client.py', 'rollout/v1/rollout_pb2.py', 'rollout/v1/rollout_pb2_grpc.py', 'rollout/v1/backend_pb2.py']) expect(names).toContain(f);
  });

  it('installs with `pip install ./python` into a fresh venv (pip builds it from the checkout)', async () => {
    const venv = join(dist, 'fresh-venv');
    await ok(UV, ['venv', '-q', '--seed', '--python', 'python3', venv]);
    await ok(`${venv}/bin/python`, ['-m', 'pip', 'install', '-q', '--disable-pip-version-check', './python']);
    const where = JSON.parse(await ok(`${venv}/bin/python`, ['-c', WHERE])) as { protobuf: string; client: string; stubs: string };
    expect(where.client).toContain('site-packages');
    expect(where.stubs).toContain('site-packages');
  }, 300_000);

  it.each(LEGS)('on $venv: installs and passes its test suite (or its runtime-facing part) against real servers', async (leg) => {
    const python = `${ROOT}${leg.venv}/bin/python`;
    await ok(UV, ['pip', 'install', '-q', '--python', python, '--reinstall-package', 'rollout-service-client', wheel]);
    const where = JSON.parse(await ok(python, ['-c', WHERE], { PYTHONPATH: '' })) as { protobuf: string; grpcio: string; client: string; stubs: string };
    // The package's open ranges must have accepted the venv's pinned runtime (a resolver that swapped it shows here).
    expect(where.protobuf).toMatch(leg.protobuf);
    expect(where.grpcio).toMatch(leg.grpcio);
    expect(where.client).toContain('site-packages');
    expect(where.stubs).toContain('site-packages');
    // pytest's own tmp_path root (it keeps the last three runs' directories otherwise): this test's, removed below.
    const basetemp = await mkdtemp(join(tmpdir(), 'rollout-pytest-'));
    const r = await run(`${ROOT}${leg.venv}/bin/pytest`, ['-q', '-p', 'no:cacheprovider', `--basetemp=${basetemp}`, ...(leg.select ?? ['python/tests'])], { ROLLOUT_REPO: ROOT }).finally(() =>
      rm(basetemp, { recursive: true, force: true }),
    );
    const last = r.stdout.trim().split('\n').at(-1) ?? '';
    expect(r.code, `${leg.venv}:\n${r.stdout.slice(-6000)}\n${r.stderr.slice(-3000)}`).toBe(0);
    // Nothing skipped, nothing failed; the runtime-facing legs leave out exactly the two server-kill cases.
    expect(last).toMatch(leg.select ? /^\d+ passed, 2 deselected in / : /^\d+ passed in /);
  }, 900_000);

  describe('examples/python/grpo_loop.py', () => {
    let h: Harness;
    beforeAll(async () => {
      h = await startHarness();
    });
    afterAll(async () => h?.close());

    it('streams GRPO groups from a real server and prints per-step reward and token statistics', async () => {
      const leg = LEGS[0]!;
      await ok(UV, ['pip', 'install', '-q', '--python', `${ROOT}${leg.venv}/bin/python`, '--reinstall-package', 'rollout-service-client', wheel]);
      const r = await run(`${ROOT}${leg.venv}/bin/python`, ['examples/python/grpo_loop.py', '--target', h.server.address, '--steps', '2', '--groups-per-step', '4', '--group-size', '4']);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stderr).toMatch(/step 1: reward /);
      const summary = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { steps: { groups: number; samples: number; failed: number; reward_mean: number; sampled_tokens_mean: number }[]; failed_samples: number };
      expect(summary.steps).toHaveLength(2);
      for (const step of summary.steps) {
        expect(step.groups).toBe(4);
        expect(step.samples + step.failed).toBe(16);
        expect(step.reward_mean).toBeGreaterThanOrEqual(0);
        expect(step.sampled_tokens_mean).toBeGreaterThan(0);
      }
    }, 300_000);
  });
});
