import { describe, expect, it } from 'vitest';
import { formatBackends } from '../../src/cli/backends.js';
import { Backend } from '../../gen/ts/rollout/v1/backend.js';

describe('rollout backends table', () => {
  it('says why an unhealthy backend is not usable, below the table, and nothing for healthy ones', () => {
    const out = formatBackends([
      Backend.fromPartial({ id: 'a', url: 'http://a:8000', healthy: true, maxConcurrency: 8 }),
      Backend.fromPartial({ id: 'b', url: 'http://b:8000', healthy: false, unusableReason: 'it serves model "other", not "qwen3"' }),
      Backend.fromPartial({ id: 'c', url: 'http://c:8000', healthy: false, unusableReason: 'health checks failing' }),
    ]);
    const [table, reasons] = out.split('\n\n');
    expect(table!.split('\n')).toHaveLength(4);
    expect(table).toMatch(/^b\s+\S+\s+no\s/m);
    expect(reasons!.split('\n')).toEqual(['b: not usable: it serves model "other", not "qwen3"', 'c: not usable: health checks failing']);
    expect(formatBackends([Backend.fromPartial({ id: 'a', healthy: true })])).not.toContain('not usable');
  });
});
