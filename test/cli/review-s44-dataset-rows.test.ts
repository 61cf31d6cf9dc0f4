import { describe, expect, it } from 'vitest';
import { mapRow } from '../../src/cli/submit-dataset.js';

/**
 * A verl row whose ground truth is missing (null in a Parquet column, an empty list, an object) has no answer to check
 * against: mapped to the string "null" or "undefined" it ran, every sample scored reward 0 against it, and the pass
 * rate read as the policy's. It is refused instead, naming the row and the field (the runner reports it and goes on).
 */
const verl = (groundTruth: unknown): Record<string, unknown> => ({
  data_source: 'gsm8k',
  prompt: [{ role: 'user', content: 'What is 1+1?' }],
  ability: 'math',
  reward_model: { ground_truth: groundTruth, style: 'rule' },
});

describe('verl rows without a usable ground truth (review s44)', () => {
  it.each([[null], [[]], [[null]], [{ value: 2 }], [''], [Number.NaN]])('refuses ground_truth %j, naming the row and field', (truth) => {
    expect(() => mapRow({ index: 7, row: verl(truth) }, 'math')).toThrow(/^row 7: reward_model\.ground_truth /);
  });

  it('maps the usable ones: a string, a number, the first of a list', () => {
    expect(mapRow({ index: 0, row: verl('2') }, 'math').instance).toEqual({ problem: 'What is 1+1?', answer: '2' });
    expect(mapRow({ index: 0, row: verl(2) }, 'math').instance).toEqual({ problem: 'What is 1+1?', answer: 2 });
    expect(mapRow({ index: 0, row: verl(['2', '2.0']) }, 'math').instance).toEqual({ problem: 'What is 1+1?', answer: '2' });
    expect(mapRow({ index: 0, row: verl([3]) }, 'math').instance).toEqual({ problem: 'What is 1+1?', answer: '3' });
  });
});
