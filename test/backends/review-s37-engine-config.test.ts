import { afterEach, describe, expect, it } from 'vitest';
import { DEFAULT_BODY_IDLE_MS } from '../../src/backends/engine-http.js';
import { DEFAULT_MAX_RETRY_AFTER_MS } from '../../src/backends/pool-options.js';
import { parseConfig } from '../../src/config.js';
import { RolloutError } from '../../src/errors.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { capturedLogger } from '../support/test-environments.js';

// The engine body-idle timeout (an answer whose body stalls after its headers is a lost engine) and the cap on an
// engine's Retry-After were built-in defaults only: no server config could set them. They are now
// backendBodyIdleTimeoutMs and backendMaxRetryAfterMs, validated and wired to every engine client (configured and
// added by AddBackend) and to the pool. The engines are fake vLLMs over real HTTP (test doubles).

function configError(input: unknown): RolloutError {
  try {
    parseConfig(input);
  } catch (err) {
    if (err instanceof RolloutError) return err;
    throw err;
  }
  throw new Error('the config was accepted');
}

let harness: ServerHarness | undefined;
let extra: FakeVllmEngine | undefined;
afterEach(async () => {
  await harness?.close();
  harness = undefined;
  await extra?.close();
  extra = undefined;
});

describe('engine timeouts in the server config', () => {
  it('default to the built-in values and are validated: positive, bounded, body idle at most the request timeout', () => {
    const defaults = parseConfig({});
    expect(defaults.backendBodyIdleTimeoutMs).toBe(DEFAULT_BODY_IDLE_MS);
    expect(defaults.backendMaxRetryAfterMs).toBe(DEFAULT_MAX_RETRY_AFTER_MS);
    for (const field of ['backendBodyIdleTimeoutMs', 'backendMaxRetryAfterMs']) {
      for (const bad of [0, -1, 1.5, 2 ** 31, 'soon']) expect(configError({ [field]: bad }).field, `${field} = ${String(bad)}`).toBe(field);
    }
    const longer = configError({ backendRequestTimeoutMs: 10_000, backendBodyIdleTimeoutMs: 20_000 });
    expect(longer.field).toBe('backendBodyIdleTimeoutMs');
    expect(longer.message).toMatch(/backendBodyIdleTimeoutMs \(20000\) must be at most backendRequestTimeoutMs \(10000\)/);
    // No request timeout (0), or the default body idle under a short request timeout (which then bounds it): accepted.
    expect(parseConfig({ backendRequestTimeoutMs: 0, backendBodyIdleTimeoutMs: 600_000 }).backendBodyIdleTimeoutMs).toBe(600_000);
    expect(parseConfig({ backendRequestTimeoutMs: 10_000 }).backendBodyIdleTimeoutMs).toBe(DEFAULT_BODY_IDLE_MS);
    expect(parseConfig({ backendBodyIdleTimeoutMs: 5_000, backendMaxRetryAfterMs: 1_000 })).toMatchObject({ backendBodyIdleTimeoutMs: 5_000, backendMaxRetryAfterMs: 1_000 });
  });

  it('reach the pool and every engine client: a stalled body is a lost engine after the configured time, for configured and added engines', async () => {
    const { tokenizer } = await loadQwen3();
    // Each engine's first completion sends its headers and 10 bytes, then nothing for a minute.
    const stallFirst = ({ index }: { index: number }) => (index === 0 ? { kind: 'slowDrop' as const, afterMs: 60_000, partial: '{"id":"cm' } : undefined);
    const { logger, lines } = capturedLogger('debug');
    harness = await startServerHarness({
      config: { backendBodyIdleTimeoutMs: 300, backendMaxRetryAfterMs: 1_234 },
      engine: { inject: stallFirst },
      logger,
    });
    const pool = harness.server.runtime.deps.pool;
    expect(pool.settings.maxRetryAfterMs).toBe(1_234);
    const prompt = tokenizer.encode('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
    const stalled = (): string[] => lines.filter((l) => l.includes('then nothing for 300 ms'));

    // The configured engine: its stalled answer is read as a lost engine (health checked, the request sent again).
    const lease = await pool.acquire('configured');
    await expect(lease.generate({ promptIds: prompt, maxTokens: 8, signal: new AbortController().signal })).resolves.toMatchObject({ finishReason: expect.any(String) });
    expect(stalled()).toHaveLength(1);
    lease.release();

    // An engine added by AddBackend, alone in the pool: the same.
    extra = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: 0, inject: stallFirst });
    const [configured] = await harness.client.listBackends();
    await harness.client.removeBackend(configured!.id);
    await harness.client.addBackend({ url: extra.url, id: 'added', maxConcurrency: 4 });
    const second = await pool.acquire('added');
    expect(second.backendId).toBe('added');
    await expect(second.generate({ promptIds: prompt, maxTokens: 8, signal: new AbortController().signal })).resolves.toMatchObject({ backendId: 'added' });
    expect(stalled()).toHaveLength(2);
    second.release();
  });
});
