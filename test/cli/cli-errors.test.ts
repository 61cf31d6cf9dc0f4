import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { startServerHarness } from '../support/server-harness.js';

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
    expect(journal.out).toMatch(/^rollout: journal\.dir: cannot open a journal in .*journal-is-a-file: EEXIST/m);
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
