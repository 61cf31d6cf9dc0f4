import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { eventually } from '../support/wait.js';
import { createLogger } from '../../src/observability/logger.js';
import { RateLimitedLog } from '../../src/observability/rate-limited-log.js';

/**
 * The token bucket refills by the time since its last line. Read from the wall clock, a step back (NTP correcting a
 * clock that ran fast, a VM restored from a snapshot) made that time negative: the bucket went that many seconds ×
 * linesPerSecond below empty, and every refused call and failed trajectory went unlogged for as long as the step.
 */
function capture(): { logger: ReturnType<typeof createLogger>; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const l of chunk.toString('utf8').split('\n')) if (l) lines.push(JSON.parse(l) as Record<string, unknown>);
      done();
    },
  });
  return { logger: createLogger({ level: 'info', destination: sink }), lines };
}

describe('RateLimitedLog when its clock steps back', () => {
  it('an hour back costs no lines: the next line a second later is written, carrying the count of those dropped', () => {
    const { logger, lines } = capture();
    let now = 10_000_000;
    const log = new RateLimitedLog(logger, { burst: 2, linesPerSecond: 1, now: () => now });
    for (let i = 0; i < 3; i++) log.write('warn', { i }, 'refused');
    expect(lines).toHaveLength(2);
    now -= 3_600_000; // the clock is set back an hour
    expect(log.write('warn', { i: 3 }, 'refused')).toBe(false);
    now += 1_000;
    expect(log.write('warn', { i: 4 }, 'refused')).toBe(true);
    expect(lines[2]).toMatchObject({ i: 4, suppressed: 2 });
  });

  it('by default is not fooled by the wall clock stepping back: lines go on being written as time passes', async () => {
    const { logger, lines } = capture();
    const realNow = Date.now;
    try {
      let offset = 0;
      Date.now = () => realNow() - offset;
      // One line per millisecond: the next is due almost at once.
      const log = new RateLimitedLog(logger, { burst: 1, linesPerSecond: 1_000 });
      expect(log.write('warn', { i: 0 }, 'refused')).toBe(true);
      offset = 3_600_000; // the wall clock is set back an hour (and runs on from there)
      let i = 1;
      await eventually(() => log.write('warn', { i: i++ }, 'refused'), 'a line written after the clock stepped back');
      expect(lines).toHaveLength(2);
    } finally {
      Date.now = realNow;
    }
  });
});
