import { describe, expect, it } from 'vitest';
import { attachIdsJson, bodyWithIds, idsJson, innerPiece, piecesText } from '../../src/backends/prompt-json.js';

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

  it('takes pieces as text or as the text\'s bytes (a token thread\'s), and cuts a piece\'s brackets without copying', () => {
    const bytes = new TextEncoder().encode('[151643,0,7]');
    const ids = attachIdsJson(new Int32Array([151_643, 0, 7]), [bytes]);
    expect(piecesText(idsJson(ids))).toBe('[151643,0,7]');
    expect(JSON.parse(piecesText(bodyWithIds('prompt', ids, { n: 2 })))).toEqual({ prompt: [151_643, 0, 7], n: 2 });
    const inner = innerPiece(bytes) as Uint8Array;
    expect(inner.buffer).toBe(bytes.buffer);
    expect(piecesText([inner])).toBe('151643,0,7');
    expect(innerPiece('[1,2]')).toBe('1,2');
  });

  it('builds a request body that parses to the ids and the other fields', () => {
    const ids = attachIdsJson([7, 0, 151_643], ['[7,0', ',151643]']);
    const body = bodyWithIds('prompt', ids, { model: 'm "quoted"', max_tokens: 4, stop: ['</s>'] });
    expect(JSON.parse(body.join(''))).toEqual({ prompt: [7, 0, 151_643], model: 'm "quoted"', max_tokens: 4, stop: ['</s>'] });
    expect(JSON.parse(bodyWithIds('input_ids', [], { stream: false }).join(''))).toEqual({ input_ids: [], stream: false });
  });
});
