import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, mathTask } from '../support/harness.js';
import { makeTestCerts } from '../support/test-certs.js';
import { makeMathProblem } from '../../src/testing/arithmetic.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

function rollout(args: string[]): { child: ChildProcess; output: () => string; exited: Promise<number | null> } {
  const child = spawn(process.execPath, ['bin/rollout.js', ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' } });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  return { child, output: () => out, exited };
}

async function waitFor(predicate: () => RegExpMatchArray | null, ms: number): Promise<RegExpMatchArray> {
  const until = Date.now() + ms;
  for (;;) {
    const m = predicate();
    if (m) return m;
    if (Date.now() > until) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('the rollout CLI', () => {
  it('`rollout demo` streams every trajectory with progress and exits 0', async () => {
    const demo = rollout(['demo', '--groups', '3', '--group-size', '2', '--latency-ms', '0']);
    const code = await demo.exited;
    const out = demo.output();
    expect(code, out).toBe(0);
    const lines = out.split('\n').filter((l) => /^\[\s*\d+\/6\]/.test(l));
    expect(lines).toHaveLength(6);
    expect(out).toContain('6/6 trajectories');
    expect(out).toContain('0 infrastructure failures');
  });

  it('`rollout demo --engine embedded` runs the demo on llama.cpp in-process and exits 0 without infrastructure failures', async () => {
    const demo = rollout(['demo', '--engine', 'embedded', '--groups', '1', '--group-size', '2']);
    const code = await demo.exited;
    const out = demo.output();
    expect(code, out).toBe(0);
    expect(out).toContain('embedded llama.cpp engine');
    // Random weights: every sample ends COMPLETED or TRUNCATED, unrewarded.
    expect(out.split('\n').filter((l) => /^\[\s*\d+\/2\] \S+ (COMPLETED|TRUNCATED)/.test(l))).toHaveLength(2);
    expect(out).toContain('2/2 trajectories');
    expect(out).toContain('0 infrastructure failures');
  }, 180_000);

  it('`rollout serve --fake-engine` serves a client and shuts down cleanly on SIGTERM', async () => {
    const serve = rollout(['serve', '--port', '0', '--fake-engine', '--fake-latency-ms', '0', '--run-timeout-ms', '60000']);
    try {
      const [, address] = await waitFor(() => serve.output().match(/rollout server listening on (\S+)/), 30_000);
      const client = new RolloutClient(address!);
      const session = client.openSession();
      await session.submit(mathTask('cli-1', 2, 4));
      session.close();
      const trajectories = await collect(session.trajectories());
      client.close();
      expect(trajectories.map((t) => t.status)).toEqual([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED]);
    } finally {
      serve.child.kill('SIGTERM');
    }
    expect(await serve.exited).toBe(0);
  });

  it('`rollout backends` lists capacity with its source and the logprobs mode; `backends add` shows what was learned or why refused', async () => {
    const serve = rollout(['serve', '--port', '0', '--fake-engine', '--fake-latency-ms', '0']);
    try {
      const [, address] = await waitFor(() => serve.output().match(/rollout server listening on (\S+)/), 30_000);
      const list = rollout(['backends', '--address', address!]);
      expect(await list.exited, list.output()).toBe(0);
      const [header, row] = list.output().trim().split('\n');
      expect(header).toMatch(/^id\s+kind\s+healthy\s+capacity\s+logprobs\s+max_model_len/);
      // The fake vLLM (a test double) serves dev-mode /server_info: processed_logprobs, max_num_seqs 256.
      expect(row).toMatch(/vllm\s+yes\s+256 \(engine\)\s+processed\s+40960/);
      const url = row!.trim().split(/\s+/).at(-1)!;

      const added = rollout(['backends', 'add', url, '--address', address!, '--id', 'again', '--max-concurrency', '4']);
      expect(await added.exited, added.output()).toBe(0);
      expect(added.output()).toMatch(/again\s+vllm\s+yes\s+4 \(configured\)\s+processed/);
      const refused = rollout(['backends', 'add', url, '--address', address!, '--id', 'wrong', '--logprobs-mode', 'raw']);
      expect(await refused.exited).toBe(1);
      expect(refused.output()).toMatch(/rollout: the server answered INVALID_ARGUMENT: logprobs_mode: declared raw, but engine \S+ reports processed/);
      expect(refused.output()).not.toMatch(/\n\s+at .*\.(ts|js):\d+/);
    } finally {
      serve.child.kill('SIGTERM');
    }
    expect(await serve.exited).toBe(0);
  });

  it('client commands reach a server that asks for tokens and mTLS (token files, CA, client certificate); without the token they say UNAUTHENTICATED', async () => {
    const certs = await makeTestCerts();
    const dir = mkdtempSync(join(tmpdir(), 'rollout-cli-auth-'));
    const tokenFile = join(dir, 'token');
    const adminFile = join(dir, 'admin');
    writeFileSync(tokenFile, 'trainer-secret\n');
    writeFileSync(adminFile, 'admin-secret\n');
    const serve = rollout(['serve', '--port', '0', '--fake-engine', '--fake-latency-ms', '0', '--token-file', tokenFile, '--admin-token-file', adminFile,
      '--tls-cert', certs.serverCertFile, '--tls-key', certs.serverKeyFile, '--tls-client-ca', certs.caFile, '--tls-require-client-cert']);
    try {
      const [, address] = await waitFor(() => serve.output().match(/rollout server listening on (\S+)/), 30_000);
      const tls = ['--tls-ca', certs.caFile, '--tls-cert', certs.clientCertFile, '--tls-key', certs.clientKeyFile];
      const envs = rollout(['envs', '--address', address!, '--token-file', tokenFile, ...tls]);
      expect(await envs.exited, envs.output()).toBe(0);
      expect(envs.output()).toMatch(/^math\t/m);
      const noToken = rollout(['envs', '--address', address!, ...tls]);
      expect(await noToken.exited).toBe(1);
      expect(noToken.output()).toMatch(/rollout: the server answered UNAUTHENTICATED/);
      const list = rollout(['backends', '--address', address!, '--admin-token-file', adminFile, ...tls]);
      expect(await list.exited, list.output()).toBe(0);
      expect(list.output()).toMatch(/^id\s+kind\s+healthy/m);
      const dataset = join(dir, 'rows.jsonl');
      const p = makeMathProblem(7);
      writeFileSync(dataset, `${JSON.stringify({ problem: p.question, answer: String(p.answer) })}\n`);
      const output = join(dir, 'out.jsonl');
      const submit = rollout(['submit', '--dataset', dataset, '--environment', 'math', '--server', address!, '--output', output, '--token-file', tokenFile, ...tls]);
      expect(await submit.exited, submit.output()).toBe(0);
      expect(readFileSync(output, 'utf8').trim().split('\n')).toHaveLength(1);
      const badFile = rollout(['envs', '--address', address!, '--token-file', join(dir, 'missing'), ...tls]);
      expect(await badFile.exited).toBe(2); // a usage mistake
      expect(badFile.output()).toMatch(/rollout: --token-file: cannot read .*missing/);
    } finally {
      serve.child.kill('SIGTERM');
      await certs.remove();
      rmSync(dir, { recursive: true, force: true });
    }
    expect(await serve.exited).toBe(0);
  }, 120_000);

  it('rejects a bad flag with a message, not a stack trace', async () => {
    const bad = rollout(['serve', '--port', 'abc']);
    expect(await bad.exited).not.toBe(0);
    expect(bad.output()).toContain('not an integer');
  });

  it('names the sandbox drivers it accepts when --sandbox-driver is unknown', async () => {
    const bad = rollout(['serve', '--sandbox-driver', 'docker']);
    expect(await bad.exited).not.toBe(0);
    expect(bad.output()).toMatch(/Allowed choices are bwrap, apptainer/);
  });
});

describe('rollout serve --config', () => {
  it('fails start-up on a misspelt key at any depth with a readable message naming it, not a stack trace', async () => {
    const { mkdtemp, writeFile, rm } = await import('node:fs/promises');
    const { tmpdir } = await import('node:os');
    const dir = await mkdtemp(`${tmpdir()}/rollout-cli-`);
    try {
      const file = `${dir}/config.json`;
      await writeFile(file, JSON.stringify({ port: 0, init: { concurrency: 8 }, sandbox: { memroyMb: 512 } }));
      const bad = rollout(['serve', '--config', file]);
      expect(await bad.exited).toBe(2);
      expect(bad.output()).toContain('Unrecognized key: "memroyMb"');
      expect(bad.output()).toContain('at sandbox');
      expect(bad.output()).not.toMatch(/\n\s+at .*\.(ts|js):\d+/);
      await writeFile(file, '{ "port": 0, ');
      const broken = rollout(['serve', '--config', file]);
      expect(await broken.exited).toBe(2);
      expect(broken.output()).toContain(`config file ${file} is not JSON`);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('takes host and port from the config file unless flags say otherwise', async () => {
    const { mkdtemp, writeFile, rm } = await import('node:fs/promises');
    const { tmpdir } = await import('node:os');
    const dir = await mkdtemp(`${tmpdir()}/rollout-cli-`);
    const file = `${dir}/config.json`;
    await writeFile(file, JSON.stringify({ host: '127.0.0.2', port: 0, maxNumSamples: 4 }));
    const serve = rollout(['serve', '--config', file, '--fake-engine']);
    try {
      const [, address] = await waitFor(() => serve.output().match(/rollout server listening on (\S+)/), 30_000);
      expect(address).toMatch(/^127\.0\.0\.2:\d+$/);
    } finally {
      serve.child.kill('SIGTERM');
      await serve.exited;
      await rm(dir, { recursive: true, force: true });
    }
  });
});
