import { describe, expect, it } from 'vitest';
import { attachIdsJson, bodyWithIds, idsJson } from '../../src/backends/prompt-json.js';

describe('prompt JSON', () => {
  it('writes the attached JSON of an array, and serializes any other array', () => {
    const ids = attachIdsJson([1, 2, 3], ['[', '1,2', ',3', ']']);
    expect(idsJson(ids).join('')).toBe('[1,2,3]');
    expect(idsJson([4, 5]).join('')).toBe('[4,5]');
  });

  it('serializes an Int32Array (a ledger context) as a JSON array of its ids, not as an object', () => {
    expect(idsJson(new Int32Array([9, 0, 2_147_483_647])).join('')).toBe('[9,0,2147483647]');
    expect(JSON.parse(bodyWithIds('prompt', new Int32Array([3, 1]), { n: 1 }).join(''))).toEqual({ prompt: [3, 1], n: 1 });
    const view = attachIdsJson(new Int32Array([5, 6]), ['[5', ',6]']);
    expect(idsJson(view).join('')).toBe('[5,6]');
  });

  it('builds a request body that parses to the ids and the other fields', () => {
    const ids = attachIdsJson([7, 0, 151_643], ['[7,0', ',151643]']);
    const body = bodyWithIds('prompt', ids, { model: 'm "quoted"', max_tokens: 4, stop: ['</s>'] });
    expect(JSON.parse(body.join(''))).toEqual({ prompt: [7, 0, 151_643], model: 'm "quoted"', max_tokens: 4, stop: ['</s>'] });
    expect(JSON.parse(bodyWithIds('input_ids', [], { stream: false }).join(''))).toEqual({ input_ids: [], stream: false });
  });
});
