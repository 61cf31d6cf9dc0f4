import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import type { ServerConfigInput } from '../../src/config.js';
import { startFailure as refusal } from '../support/start-failure.js';

/**
 * Backends and the model folder a start-up cannot use are refused before anything starts, as invalid_argument naming
 * the field (`rollout serve` prints one line and exits 2): never an exception from deep inside a client, and never a
 * server that starts with a backend that can only fail.
 */

const dir = mkdtempSync(join(tmpdir(), 'rollout-startup-backends-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));


describe('start-up refuses backends it cannot use, naming the field', () => {
  // Regression: any URL passed the config check, and undici's Pool constructor threw its own error: a stack trace.
  it('a URL its kind cannot reach: vllm/sglang over anything but http(s), embedded other than file:/embedded:', async () => {
    const cases: Array<[ServerConfigInput['backends'], RegExp]> = [
      [[{ url: 'ftp://127.0.0.1:9' }], /a vllm engine is reached over http: or https:, not ftp:\n\s+→ at backends\[0\]\.url/],
      [[{ kind: 'sglang', url: 'file:///models/x' }], /a sglang engine is reached over http: or https:, not file:\n\s+→ at backends\[0\]\.url/],
      [[{ kind: 'embedded', url: 'http://ops:s3cret@gpu:8000' }], /embedded backends take file:\/\/\/path\/model\.gguf or embedded:\/\/tiny-qwen3, not "http:\/\/gpu:8000"\n\s+→ at backends\[0\]\.url/],
    ];
    for (const [backends, message] of cases) {
      const err = await refusal({ backends });
      expect({ code: err.code, field: err.field }).toEqual({ code: 'invalid_argument', field: 'backends.0.url' });
      expect(err.message).toMatch(message);
      expect(err.message).not.toContain('s3cret');
    }
  });

  // Regression: two backends with one id were already_exists from the pool (exit 1), not a mistake named by its field.
  it('two backends with one id (the same --backend twice): invalid_argument naming the second\u2019s id', async () => {
    const err = await refusal({ backends: [{ url: 'http://127.0.0.1:9' }, { url: 'http://127.0.0.1:10', id: 'b' }, { url: 'http://127.0.0.1:9' }] });
    expect({ code: err.code, field: err.field }).toEqual({ code: 'invalid_argument', field: 'backends.2.id' });
    expect(err.message).toContain('the same id as backends[0] ("http://127.0.0.1:9"');
  });

  // Regression: a missing GGUF only logged a warning; the backend never loaded and its trajectories were BACKEND_ERROR.
  it('an embedded backend whose GGUF file is not there', async () => {
    const path = join(dir, 'no-such-model.gguf');
    const err = await refusal({ backends: [{ kind: 'embedded', url: `file://${path}?threads=1` }] });
    expect({ code: err.code, field: err.field, message: err.message }).toEqual({
      code: 'invalid_argument',
      field: 'backends.0.url',
      message: `backends[0].url: the embedded engine's model ${path} does not exist`,
    });
  });

  // Regression: a --model-dir that does not exist was not_found (exit 1), unlike every other mistake in what was asked.
  it('a model folder that does not exist, or is a file', async () => {
    for (const [folder, what] of [[join(dir, 'missing'), 'does not exist'], [fileURLToPath(import.meta.url), 'is not a directory']] as const) {
      const err = await refusal({ model: { dir: folder } });
      expect({ code: err.code, field: err.field }).toEqual({ code: 'invalid_argument', field: 'model.dir' });
      expect(err.message).toMatch(new RegExp(`^model\\.dir: ${folder.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')} ${what}`));
    }
  });
});
