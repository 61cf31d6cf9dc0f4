import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config.js';

describe('retention against the journal bound (config)', () => {
  it('refuses an explicit retainFinishedBytes that the journal could not hold beside running work, naming both fields', () => {
    expect(() => parseConfig({ journal: { dir: '/tmp/j', maxBytes: 100 << 20 }, retainFinishedBytes: 80 << 20 })).toThrow(
      expect.objectContaining({ code: 'invalid_argument', message: expect.stringMatching(/retainFinishedBytes .* journal\.maxBytes/) }),
    );
  });

  it('lowers the default retention to fit a small journal, and leaves it alone without a journal', () => {
    expect(parseConfig({ journal: { dir: '/tmp/j', maxBytes: 1 << 20 } }).retainFinishedBytes * 1.6).toBeLessThan(1 << 20);
    expect(parseConfig({ journal: { dir: '/tmp/j' } }).retainFinishedBytes).toBe(512 << 20);
    expect(parseConfig({}).retainFinishedBytes).toBe(512 << 20);
  });
});
