import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { createLogger } from '../../src/observability/logger.js';
import { RateLimitedLog } from '../../src/observability/rate-limited-log.js';

function capture() {
  const lines: Array<Record<string, unknown>> = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const l of chunk.toString('utf8').split('\n')) if (l) lines.push(JSON.parse(l) as Record<string, unknown>);
      done();
    },
  });
  return { logger: createLogger({ level: 'info', destination: sink }), lines };
}

describe('RateLimitedLog', () => {
  it('writes a burst, then linesPerSecond, counting what it drops onto the next line written, at its level', () => {
    const { logger, lines } = capture();
    let now = 0;
    const log = new RateLimitedLog(logger, { burst: 2, linesPerSecond: 4, now: () => now });
    let built = 0;
    const line = (i: number) => () => {
      built++;
      return { i };
    };
    for (let i = 0; i < 6; i++) log.write('warn', line(i), 'refused');
    expect(lines.map((l) => [l.i, l.level, l.msg])).toEqual([
      [0, 40, 'refused'],
      [1, 40, 'refused'],
    ]);
    // A dropped line is not even built.
    expect(built).toBe(2);
    expect(log.suppressed).toBe(4);
    now += 250; // one line's worth
    expect(log.write('info', { i: 6 }, 'refused')).toBe(true);
    expect(lines[2]).toMatchObject({ i: 6, level: 30, suppressed: 4 });
    expect(log.suppressed).toBe(0);
    expect(log.write('info', { i: 7 }, 'refused')).toBe(false);
  });
});
