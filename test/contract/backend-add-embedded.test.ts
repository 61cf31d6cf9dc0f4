import { status, type ServiceError } from '@grpc/grpc-js';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BackendKind } from '../../gen/ts/rollout/v1/backend.js';
import { DEFAULT_TINY_QWEN3, writeTinyQwen3Gguf } from '../../src/backends/embedded/tiny-qwen3.js';
import { TINY_QWEN3_URL } from '../../src/backends/embedded/embedded-url.js';
import { qwen3ModelDir } from '../../src/tokens/tokenizer.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

/**
 * An embedded engine added at runtime is held to what `serve` checks at start: its GGUF must be there and have the
 * server's vocabulary (token-in/token-out: a model whose ids mean other tokens would answer plausible garbage).
 */
describe('AddBackend of an embedded engine', () => {
  let h: ServerHarness;
  let dir: string;
  let swapped: string;

  beforeAll(async () => {
    h = await startServerHarness();
    dir = mkdtempSync(join(tmpdir(), 'add-embedded-'));
    // The tiny Qwen3 with the ids of "a" and "b" swapped: another vocabulary.
    const json = JSON.parse(readFileSync(join(qwen3ModelDir(), 'tokenizer.json'), 'utf8')) as NonNullable<Parameters<typeof writeTinyQwen3Gguf>[2]>['json'];
    const [a, b] = [json.model.vocab.a!, json.model.vocab.b!];
    json.model.vocab.a = b;
    json.model.vocab.b = a;
    swapped = join(dir, 'swapped.gguf');
    writeTinyQwen3Gguf(swapped, DEFAULT_TINY_QWEN3, { json, chatTemplate: undefined, hash: 'swapped' });
  }, 120_000);
  afterAll(async () => {
    await h?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('refuses a GGUF with another vocabulary than the server\u2019s tokenizer: INVALID_ARGUMENT naming url, nothing added', async () => {
    const err = (await h.client.addBackend({ url: `file://${swapped}?threads=1&sequences=1`, kind: BackendKind.BACKEND_KIND_EMBEDDED, id: 'swapped' }).catch((e: unknown) => e)) as ServiceError;
    expect(err.code, err.details).toBe(status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/^url: the embedded engine's model .*swapped\.gguf has another vocabulary than the tokenizer: 2 of its first \d+ ids differ/);
    expect((await h.client.listBackends()).map((b) => b.id)).not.toContain('swapped');
  });

  it('refuses a GGUF that is not there, naming url', async () => {
    const err = (await h.client.addBackend({ url: `file://${join(dir, 'missing.gguf')}`, kind: BackendKind.BACKEND_KIND_EMBEDDED }).catch((e: unknown) => e)) as ServiceError;
    expect(err.code, err.details).toBe(status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/^url: .*missing\.gguf/);
  });

  it('adds the tiny Qwen3 (the server\u2019s vocabulary)', async () => {
    const added = await h.client.addBackend({ url: `${TINY_QWEN3_URL}?threads=1&sequences=1`, kind: BackendKind.BACKEND_KIND_EMBEDDED, id: 'tiny' });
    expect(added?.id).toBe('tiny');
    expect((await h.client.listBackends()).find((b) => b.id === 'tiny')?.kind).toBe(BackendKind.BACKEND_KIND_EMBEDDED);
    await h.client.removeBackend('tiny');
  }, 60_000);
});
