import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { CappedOutput } from '../../src/sandboxes/capped-output.js';

describe('CappedOutput', () => {
  it('keeps exactly the first `limit` bytes and counts the rest', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 64 }), fc.array(fc.uint8Array({ maxLength: 40 }), { maxLength: 10 }), (limit, chunks) => {
        const out = new CappedOutput(limit);
        for (const c of chunks) out.push(Buffer.from(c));
        const all = Buffer.concat(chunks.map((c) => Buffer.from(c)));
        const kept = all.subarray(0, limit);
        expect(out.text()).toBe(kept.toString('utf8'));
        expect(out.droppedBytes).toBe(all.length - kept.length);
        expect(out.truncated).toBe(all.length > limit);
      }),
    );
  });
});
