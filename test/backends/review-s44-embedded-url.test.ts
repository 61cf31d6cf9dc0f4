import { describe, expect, it } from 'vitest';
import { parseEmbeddedUrl } from '../../src/backends/embedded/embedded-url.js';
import { backendKind } from '../../src/backends/kinds.js';
import { RolloutError } from '../../src/errors.js';

// Review s44: what an embedded backend URL may say. Its query parameters are the engine's settings (context size,
// threads, sequences); one the engine does not read must be refused, never silently run on the defaults.

const refusal = (url: string): RolloutError => {
  try {
    parseEmbeddedUrl(url);
  } catch (err) {
    if (err instanceof RolloutError) return err;
    throw err;
  }
  throw new Error(`${url} was accepted`);
};

describe('an embedded backend URL', () => {
  it('takes contextSize, threads and sequences', () => {
    expect(parseEmbeddedUrl('file:///models/m.gguf?contextSize=8192&threads=4&sequences=2')).toEqual({
      model: { kind: 'file', path: '/models/m.gguf' },
      contextSize: 8192,
      threads: 4,
      sequences: 2,
    });
    expect(parseEmbeddedUrl('embedded://tiny-qwen3')).toEqual({ model: { kind: 'tiny-qwen3' }, threads: 1 });
  });

  // Regression: a parameter the engine does not read was ignored, so a misspelt one (`contextsize=8192`, `ctx=8192`,
  // `thread=8`) ran the engine on the default (a 4096-token context, one thread) without a word: every request past
  // 4096 tokens then ended as a context overflow, i.e. a truncated trajectory, as if the policy had run long.
  it('refuses a parameter it does not know (a misspelt setting) as invalid_argument naming url and the parameter', () => {
    for (const [url, name] of [
      ['file:///models/m.gguf?contextsize=8192', 'contextsize'],
      ['embedded://tiny-qwen3?ctx=8192&threads=1', 'ctx'],
      ['embedded://tiny-qwen3?threads=1&thread=8', 'thread'],
    ] as const) {
      const err = refusal(url);
      expect(err.code, url).toBe('invalid_argument');
      expect(err.field, url).toBe('url');
      expect(err.message, url).toContain(`"${name}"`);
      expect(err.message, url).toContain('contextSize, threads, sequences');
    }
  });

  it('refuses a parameter given twice (which one would the engine use?)', () => {
    const err = refusal('embedded://tiny-qwen3?threads=1&threads=8');
    expect(err.code).toBe('invalid_argument');
    expect(err.field).toBe('url');
    expect(err.message).toContain('threads');
  });

  it('is refused where backends are checked (config, AddBackend), with the problem named', () => {
    expect(backendKind('embedded').urlProblem('embedded://tiny-qwen3?sequence=2')).toMatch(/unknown parameter "sequence"/);
    expect(backendKind('embedded').urlProblem('embedded://tiny-qwen3?sequences=2')).toBeUndefined();
  });
});
