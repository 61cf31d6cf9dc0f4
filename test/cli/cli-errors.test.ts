import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { startServerHarness } from '../support/server-harness.js';
import { DEFAULT_TINY_QWEN3, writeTinyQwen3Gguf } from '../../src/backends/embedded/tiny-qwen3.js';
import { qwen3ModelDir } from '../../src/tokens/tokenizer.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'rollout-cli-errors-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/**
 * Runs bin/rollout.js (without ROLLOUT_TOKEN / ROLLOUT_ADMIN_TOKEN from the test's environment, plus `env`); a run
 * still alive after `killAfterMs` is SIGKILLed and reported as exit code 'hung'.
 */
function rollout(args: string[], env: Record<string, string> = {}, killAfterMs = 30_000): Promise<{ code: number | null | 'hung'; out: string }> {
  const base: NodeJS.ProcessEnv = { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' };
  delete base.ROLLOUT_TOKEN;
  delete base.ROLLOUT_ADMIN_TOKEN;
  const child: ChildProcess = spawn(process.execPath, ['bin/rollout.js', ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...base, ...env } });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  let hung = false;
  const timer = setTimeout(() => {
    hung = true;
    child.kill('SIGKILL');
  }, killAfterMs);
  return new Promise((resolve) =>
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code: hung ? 'hung' : code, out });
    }),
  );
}

/** A stack trace line. */
const STACK = /\n\s+at .*\.(ts|js):\d+/;

function file(name: string, content: string): string {
  const path = join(dir, name);
  writeFileSync(path, content);
  return path;
}

/** The lines the CLI printed for a failure, without JSON log lines. */
const errorLines = (out: string): string[] => out.split('\n').filter((l) => l !== '' && !l.startsWith('{'));

describe('the rollout CLI against operator mistakes: one line, no stack trace, exit non-zero', () => {
  it('a config file whose "backends" is an object (not a list), or whose auth is a list, names the field', async () => {
    const backends = await rollout(['serve', '--config', file('backends-object.json', JSON.stringify({ port: 0, backends: { url: 'http://127.0.0.1:8000' } }))]);
    expect(backends.out).not.toMatch(/is not iterable/);
    expect(backends.out).not.toMatch(STACK);
    expect(backends.out).toMatch(/expected array, received object\n\s+→ at backends/);
    expect(backends.code).toBe(2);
    const auth = await rollout(['serve', '--config', file('auth-list.json', JSON.stringify({ port: 0, auth: ['t'] })), '--token-file', file('token', 'a-token\n')]);
    expect(auth.out).toMatch(/expected object, received array\n\s+→ at auth/);
    expect(auth.out).not.toMatch(STACK);
    expect(auth.code).toBe(2);
  }, 90_000);

  it('`serve --fake-engine` with an invalid config prints the error and exits (nothing started keeps it alive)', async () => {
    const r = await rollout(['serve', '--fake-engine', '--config', file('bad-max-admitted.json', JSON.stringify({ port: 0, maxAdmitted: 0 }))], {}, 20_000);
    expect(r.out).toContain('maxAdmitted');
    expect(r.out).not.toContain('fake vLLM engine');
    expect(r.code).toBe(2);
  }, 60_000);

  it('`serve --fake-engine` on a port in use exits 1 with "cannot listen on host:port: EADDRINUSE" (the engine is closed)', async () => {
    const busy: Server = createServer();
    await new Promise<void>((resolve) => busy.listen(0, '127.0.0.1', resolve));
    const { port } = busy.address() as { port: number };
    try {
      const r = await rollout(['serve', '--fake-engine', '--port', String(port)], {}, 45_000);
      // (grpc-js logs its own line about the failed bind before ours: "E No address added out of total 1 resolved".)
      expect(errorLines(r.out).at(-1)).toBe(`rollout: cannot listen on 127.0.0.1:${port}: EADDRINUSE (the port is in use)`);
      expect(r.out).not.toMatch(STACK);
      expect(r.code).toBe(1);
    } finally {
      busy.close();
    }
  }, 60_000);

  it('Apptainer missing (sandbox_error) and a journal directory that is a file are one line each', async () => {
    const apptainer = await rollout(['serve', '--port', '0', '--sandbox-driver', 'apptainer', '--apptainer-path', join(dir, 'no-such-apptainer')]);
    expect(errorLines(apptainer.out)).toHaveLength(1);
    expect(apptainer.out).toMatch(/^rollout: the apptainer driver needs/m);
    expect(apptainer.code).toBe(1);
    const journal = await rollout(['serve', '--port', '0', '--journal-dir', file('journal-is-a-file', 'x')]);
    expect(errorLines(journal.out)).toHaveLength(1);
    expect(journal.out).toMatch(/^rollout: journal\.dir: \S*journal-is-a-file is a file, not a directory: give journal\.dir a directory \(it is created if missing\)$/m);
    expect(journal.code).toBe(2);
  }, 90_000);

  it('a token file with a character no gRPC header may carry is refused naming the flag, without echoing the token', async () => {
    const token = file('token-with-newline', 'first-half-of-secret\nsecond-half-of-secret\n');
    const r = await rollout(['envs', '--address', '127.0.0.1:1', '--token-file', token]);
    expect(r.out).not.toContain('half-of-secret');
    expect(r.out).not.toMatch(STACK);
    expect(errorLines(r.out)).toEqual([`rollout: --token-file ${token}: the token must be printable ASCII without spaces or control characters (an HTTP/2 header cannot carry it)`]);
    expect(r.code).toBe(2);
  }, 60_000);

  it('ROLLOUT_TOKEN set but empty is an error naming it (it would silently open the server), and so is one with non-ASCII', async () => {
    const empty = await rollout(['serve', '--port', '0'], { ROLLOUT_TOKEN: '' });
    expect(errorLines(empty.out)).toEqual(['rollout: ROLLOUT_TOKEN is set but empty: give the token, or unset it for no token']);
    expect(empty.code).toBe(2);
    const accented = await rollout(['envs', '--address', '127.0.0.1:1'], { ROLLOUT_ADMIN_TOKEN: 'caf\u00e9-secret', ROLLOUT_TOKEN: 'ok-token' });
    expect(accented.out).not.toContain('caf');
    expect(errorLines(accented.out)).toEqual(['rollout: ROLLOUT_ADMIN_TOKEN: the token must be printable ASCII without spaces or control characters (an HTTP/2 header cannot carry it)']);
    expect(accented.code).toBe(2);
  }, 60_000);
});

describe('the rollout CLI: exit 2 for every mistake in what was asked, one line (or the config\u2019s report), no stack trace', () => {
  // Regression: these exited 1 (commander's own exit, not_found, already_exists), crashed with a stack trace (ftp:) or started.
  it('flags commander refuses, a model folder or a backend that cannot be used', async () => {
    const embedded = file('embedded-missing.json', JSON.stringify({ port: 0, backends: [{ kind: 'embedded', url: `file://${join(dir, 'no-such.gguf')}` }] }));
    const sglangFile = file('sglang-file-url.json', JSON.stringify({ port: 0, backends: [{ kind: 'sglang', url: 'file:///models/x' }] }));
    const cases: Array<[string[], RegExp]> = [
      [['serve', '--port', 'abc'], /^rollout: option '--port <port>' argument 'abc' is invalid\. not an integer: abc$/m],
      [['serve', '--prot', '50051'], /^rollout: unknown option '--prot' \(Did you mean --port\?\)$/m],
      [['serve', '--port', '0', '--model-dir', join(dir, 'no-such-model-dir')], /^rollout: model\.dir: .*no-such-model-dir does not exist/m],
      [['serve', '--port', '0', '--backend', 'ftp://127.0.0.1:9'], /a vllm engine is reached over http: or https:, not ftp:\n\s+→ at backends\[0\]\.url/],
      [['serve', '--config', sglangFile], /a sglang engine is reached over http: or https:, not file:\n\s+→ at backends\[0\]\.url/],
      [['serve', '--port', '0', '--backend', 'http://127.0.0.1:9', '--backend', 'http://127.0.0.1:9'], /the same id as backends\[0\] .*\n\s+→ at backends\[1\]\.id/],
      [['serve', '--config', embedded], /^rollout: backends\[0\]\.url: the embedded engine's model .*no-such\.gguf does not exist$/m],
    ];
    for (const [args, message] of cases) {
      const r = await rollout(args);
      expect({ args, code: r.code, stack: STACK.test(r.out) }).toEqual({ args, code: 2, stack: false });
      expect(r.out).toMatch(message);
      expect(r.out).not.toContain('rollout server listening');
    }
  }, 180_000);

  it('--help and --version still exit 0', async () => {
    for (const args of [['--help'], ['serve', '--help'], ['--version']]) {
      const r = await rollout(args);
      expect({ args, code: r.code }).toEqual({ args, code: 0 });
    }
  }, 60_000);
});

describe('`rollout backends` on a server with only the trainer token', () => {
  it('sends the trainer token (--token-file) to BackendService, which takes it there', async () => {
    const h = await startServerHarness({ config: { auth: { token: 'trainer-only-token' } } });
    try {
      const listed = await rollout(['backends', '--address', h.server.address, '--token-file', file('trainer-token', 'trainer-only-token\n')]);
      expect(listed.code, listed.out).toBe(0);
      expect(listed.out).toContain(h.engine.url);
      const refused = await rollout(['backends', '--address', h.server.address]);
      expect(refused.out).toContain('rollout: the server answered UNAUTHENTICATED: token required');
      expect(refused.code).toBe(1);
    } finally {
      await h.close();
    }
  }, 60_000);
});

describe('client commands against a server they cannot use: one line, bounded time, no stack trace', () => {
  it('`submit` to an address nothing listens on exits 3 (infrastructure, not the data) naming the address (the stream failure is not an unhandled rejection)', async () => {
    const dataset = file('unreachable.jsonl', '{"problem":"1+1?","answer":"2"}\n');
    const r = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--server', '127.0.0.1:1', '--output', join(dir, 'unreachable.out.jsonl')]);
    expect(r.out).not.toMatch(STACK);
    expect(r.out).toContain('[submit] the stream to 127.0.0.1:1 failed');
    expect(r.code).toBe(3);
  }, 60_000);

  it('a server that accepts the connection and never answers: `envs` and `submit` give up after --connect-timeout-ms, naming the address', async () => {
    // A TCP listener that never speaks HTTP/2: what a firewall black hole or a wrong port behind a proxy looks like.
    const silent: Server = createServer(() => undefined);
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const address = `127.0.0.1:${(silent.address() as { port: number }).port}`;
    try {
      const envs = await rollout(['envs', '--address', address, '--connect-timeout-ms', '1000'], {}, 30_000);
      expect(envs.code).toBe(1);
      expect(errorLines(envs.out)).toEqual([`rollout: cannot reach a gRPC server at ${address} within 1 s (nothing answered the connection)`]);
      const dataset = file('silent.jsonl', '{"problem":"1+1?","answer":"2"}\n');
      const submit = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--server', address, '--connect-timeout-ms', '1000', '--output', join(dir, 'silent.out.jsonl')], {}, 30_000);
      expect(submit.code).toBe(3);
      expect(submit.out).toContain(`cannot reach a gRPC server at ${address} within 1 s`);
      expect(submit.out).not.toMatch(STACK);
    } finally {
      silent.close();
    }
  }, 90_000);

  it('an empty address, and a --tls-cert/--tls-key that are not PEM, are refused naming the flag (exit 2)', async () => {
    const empty = await rollout(['envs', '--address', '']);
    expect(errorLines(empty.out)).toEqual(['rollout: --address: empty: give host:port']);
    expect(empty.code).toBe(2);
    const garbage = file('not-a-pem', 'not a certificate\n');
    const tls = await rollout(['envs', '--address', '127.0.0.1:1', '--tls-cert', garbage, '--tls-key', garbage]);
    expect(tls.out).not.toMatch(STACK);
    expect(errorLines(tls.out)).toEqual([`rollout: --tls-cert ${garbage}, --tls-key ${garbage}: not a usable PEM certificate and key (error:0480006C:PEM routines::no start line)`]);
    expect(tls.code).toBe(2);
    const ca = await rollout(['envs', '--address', '127.0.0.1:1', '--tls-ca', garbage]);
    expect(errorLines(ca.out)).toEqual([`rollout: --tls-ca ${garbage}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)`]);
    expect(ca.code).toBe(2);
  }, 60_000);
});

describe('`rollout submit` with a dataset or output it cannot use: one line naming the file, exit 2, before any submit', () => {
  it('a directory as dataset, a Parquet dataset that is not Parquet, an output in a missing directory', async () => {
    const good = file('good.jsonl', '{"problem":"1+1?","answer":"2"}\n');
    const cases: Array<[string[], string]> = [
      [['--dataset', dir], `rollout: cannot read dataset ${dir}: EISDIR: illegal operation on a directory, read`],
      [['--dataset', file('not.parquet', 'not parquet\n')], `rollout: cannot read dataset ${join(dir, 'not.parquet')}: parquet file invalid (footer != PAR1)`],
      [['--dataset', good, '--output', join(dir, 'missing', 'out.jsonl')], `rollout: --output ${join(dir, 'missing', 'out.jsonl')}: cannot open: ENOENT: no such file or directory, open '${join(dir, 'missing', 'out.jsonl')}'`],
      [['--dataset', good, '--output', dir], `rollout: --output ${dir}: cannot open: EISDIR: illegal operation on a directory, open '${dir}'`],
    ];
    for (const [args, line] of cases) {
      const r = await rollout(['submit', '--environment', 'math', '--server', '127.0.0.1:1', ...args]);
      expect({ args, code: r.code, lines: errorLines(r.out) }).toEqual({ args, code: 2, lines: [line] });
    }
  }, 90_000);
});

describe('`rollout serve` with an embedded engine whose GGUF has another vocabulary than the tokenizer', () => {
  it('refuses to start (exit 2), naming backends[i].url and the first id that differs', async () => {
    const json = JSON.parse(readFileSync(join(qwen3ModelDir(), 'tokenizer.json'), 'utf8')) as NonNullable<Parameters<typeof writeTinyQwen3Gguf>[2]>['json'];
    const [a, b] = [json.model.vocab.a!, json.model.vocab.b!];
    [json.model.vocab.a, json.model.vocab.b] = [b, a];
    const gguf = join(dir, 'other-vocabulary.gguf');
    writeTinyQwen3Gguf(gguf, DEFAULT_TINY_QWEN3, { json, chatTemplate: undefined, hash: 'other' });
    const config = file('embedded-other-vocabulary.json', JSON.stringify({ port: 0, backends: [{ kind: 'embedded', url: `file://${gguf}` }] }));
    const r = await rollout(['serve', '--config', config], {}, 60_000);
    expect(errorLines(r.out)).toEqual([
      `rollout: backends[0].url: the embedded engine's model ${gguf} has another vocabulary than the tokenizer: 2 of its first 151669 ids differ, the first ${a} ("b" in the model, id ${b} in the tokenizer)`,
    ]);
    expect(r.out).not.toContain('rollout server listening');
    expect(r.code).toBe(2);
  }, 90_000);
});

describe('`rollout image build` / `rollout swe build` with paths they cannot use: one line naming the flag, exit 2, nothing left behind', () => {
  it('--out in a missing directory or on a directory, --cache-dir that is a file', async () => {
    const missing = join(dir, 'no-such-dir', 'image.sif');
    const out = await rollout(['image', 'build', '--out', missing], {}, 120_000);
    expect({ code: out.code, lines: errorLines(out.out).filter((l) => !l.startsWith('[image') && !l.startsWith('image ')) }).toEqual({
      code: 2,
      lines: [`rollout: --out ${missing}: cannot write the image there: ENOENT: no such file or directory`],
    });
    const onDir = await rollout(['image', 'build', '--out', dir], {}, 120_000);
    expect(errorLines(onDir.out).at(-1)).toBe(`rollout: --out ${dir}: cannot write the image there: it is a directory`);
    expect(onDir.code).toBe(2);
    expect(readdirSync(dir).filter((f) => f.includes('.partial-'))).toEqual([]);
    const cacheFile = file('cache-is-a-file', 'x');
    for (const args of [['image', 'build', '--cache-dir', cacheFile], ['swe', 'build', '--cache-dir', cacheFile]]) {
      const r = await rollout(args, {}, 120_000);
      expect({ args, code: r.code, lines: errorLines(r.out) }).toEqual({ args, code: 2, lines: [`rollout: --cache-dir ${cacheFile}: cannot be used as a directory (it is a file)`] });
    }
  }, 240_000);
});
