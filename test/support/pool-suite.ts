import { afterEach, beforeAll } from 'vitest';
import { BackendPool, type BackendPoolOptions } from '../../src/backends/pool.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../src/tokens/types.js';

/**
 * The setup the BackendPool suites share: every pool a test makes is closed after it and every engine it starts
 * (fake vLLM/SGLang over real HTTP) is stopped; with `question`, the real Qwen3 tokenizer is loaded once and the
 * question rendered as a chat prompt (token ids) ready for the engines' requests.
 */
export interface PoolSuite {
  /** A pool with the suite's defaults under `options`, closed after the test. */
  makePool(options?: BackendPoolOptions): BackendPool;
  /** Stops `engine` after the test; returns it. */
  track<T extends { close(): Promise<void> }>(engine: T): T;
  /** The Qwen3 tokenizer (inside tests: it loads in beforeAll). */
  readonly tokenizer: Tokenizer;
  /** The question's chat prompt ids (inside tests). */
  readonly prompt: number[];
}

export function poolSuite(options: { pool?: BackendPoolOptions; question?: string } = {}): PoolSuite {
  const pools: BackendPool[] = [];
  const engines: Array<{ close(): Promise<void> }> = [];
  let tokenizer: Tokenizer | undefined;
  let prompt: number[] | undefined;

  const { question } = options;
  if (question !== undefined) {
    beforeAll(async () => {
      ({ tokenizer } = await loadQwen3());
      prompt = tokenizer.encode(`<|im_start|>user\n${question}<|im_end|>\n<|im_start|>assistant\n`);
    });
  }
  afterEach(async () => {
    for (const pool of pools.splice(0)) pool.close();
    for (const engine of engines.splice(0)) await engine.close();
  });

  const loaded = <T>(value: T | undefined, what: string): T => {
    if (value === undefined) throw new Error(`poolSuite: ${what} is there only inside tests of a suite given a question`);
    return value;
  };
  return {
    makePool(poolOptions = {}) {
      const pool = new BackendPool({ ...options.pool, ...poolOptions });
      pools.push(pool);
      return pool;
    },
    track(engine) {
      engines.push(engine);
      return engine;
    },
    get tokenizer() {
      return loaded(tokenizer, 'the tokenizer');
    },
    get prompt() {
      return loaded(prompt, 'the prompt');
    },
  };
}
