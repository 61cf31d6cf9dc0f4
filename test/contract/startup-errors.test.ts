import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerConfigInput } from '../../src/config.js';
import type { RolloutError } from '../../src/errors.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { startFailure as startRefused } from '../support/start-failure.js';

/** What start-up fails with, for a config with no backends unless it names some. */
const startFailure = (config: ServerConfigInput): Promise<RolloutError> => startRefused({ backends: [], ...config });

describe('start-up failures say what is wrong, in one line an operator can act on', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rollout-startup-errors-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('refuses a token no gRPC client could ever send (a header cannot carry it), naming the field, not the token', async () => {
    const err = await startFailure({ auth: { token: 'secret-from-template\n' } });
    expect(err.code).toBe('invalid_argument');
    expect(err.field).toBe('auth.token');
    expect(err.message).not.toContain('secret-from-template');
  });

  describe('a configured engine that contradicts its config', () => {
    let engine: FakeVllmEngine;
    beforeAll(async () => {
      const { tokenizer } = await loadQwen3();
      engine = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: 0, logprobsMode: 'processed_logprobs' });
    });
    afterAll(() => engine?.close());

    it('is named by its URL without the password of its userinfo', async () => {
      const withPassword = engine.url.replace('http://', 'http://ops:hunter2-engine-password@');
      const err = await startFailure({ model: engine.model, backends: [{ url: withPassword, logprobsMode: 'raw' }] });
      expect(err.message).toMatch(/reports processed/);
      expect(err.message).toContain(`backends[0] (${engine.url})`);
      expect(err.message).not.toContain('hunter2-engine-password');
      expect(err.field).toBe('backends.0.logprobsMode');
    });
  });

  it('a port in use is UNAVAILABLE "cannot listen on host:port: EADDRINUSE"', async () => {
    const busy: Server = createServer();
    await new Promise<void>((resolve) => busy.listen(0, '127.0.0.1', resolve));
    const { port } = busy.address() as { port: number };
    try {
      const err = await startFailure({ port });
      expect(err.code).toBe('unavailable');
      expect(err.message).toBe(`cannot listen on 127.0.0.1:${port}: EADDRINUSE (the port is in use)`);
    } finally {
      busy.close();
    }
  });

  it('a journal directory that is a file is failed_precondition naming journal.dir', async () => {
    const file = join(dir, 'not-a-directory');
    writeFileSync(file, 'x');
    const err = await startFailure({ journal: { dir: file } });
    expect(err.code).toBe('failed_precondition');
    expect(err.field).toBe('journal.dir');
    expect(err.message).toBe(`journal.dir: ${file} is a file, not a directory: give journal.dir a directory (it is created if missing)`);
  });
});
