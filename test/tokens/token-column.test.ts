import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { idColumn, logprobColumn, maskColumn } from '../../src/tokens/token-column.js';

const step = fc.oneof(
  fc.record({ kind: fc.constant('append' as const), values: fc.array(fc.integer({ min: 0, max: 2 ** 31 - 1 }), { maxLength: 700 }) }),
  fc.record({ kind: fc.constant('fill' as const), value: fc.integer({ min: 0, max: 1 }), count: fc.nat(700) }),
);

describe('TokenColumn', () => {
  it('holds exactly what was appended, across every growth, and hands out any range as a number[] or a stable view', () => {
    fc.assert(
      fc.property(fc.array(step, { maxLength: 12 }), fc.nat(), fc.nat(), (steps, a, b) => {
        const column = idColumn();
        const expected: number[] = [];
        const views: [Int32Array, number[]][] = [];
        for (const s of steps) {
          if (s.kind === 'append') {
            column.append(s.values);
            expected.push(...s.values);
          } else {
            column.fill(s.value, s.count);
            for (let i = 0; i < s.count; i++) expected.push(s.value);
          }
          // A view taken now keeps what it shows, whatever is appended (and reallocated) later.
          views.push([column.view(), [...expected]]);
        }
        expect(column.length).toBe(expected.length);
        expect(column.toArray()).toEqual(expected);
        const [start, end] = [a % (expected.length + 1), b % (expected.length + 1)].sort((x, y) => x - y) as [number, number];
        expect(column.toArray(start, end)).toEqual(expected.slice(start, end));
        expect([...column.view()]).toEqual(expected);
        for (const [view, shown] of views) expect([...view]).toEqual(shown);
      }),
    );
  });

  it('keeps logprobs as the doubles they were (not rounded to float32) and the mask as 0/1', () => {
    const logprobs = logprobColumn();
    const values = [-0.1, -1e-300, -Infinity, -123.456789012345, 0];
    logprobs.append(values);
    expect(logprobs.toArray()).toEqual(values);
    const mask = maskColumn();
    mask.fill(1, 300);
    mask.fill(0, 2);
    mask.fill(1, 1);
    expect(mask.toArray(298)).toEqual([1, 1, 0, 0, 1]);
  });
});
