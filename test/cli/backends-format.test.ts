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

  it("shows what the server and its engines say as text: a control sequence or a line break in an id, a url or a reason reaches the terminal escaped", () => {
    // The reason can carry an engine's own words (an HTTP error body, a model name it serves), the id and url are the
    // adder's: raw, `\x1b]52;c;...\x07` wrote the operator's clipboard and `\x1b[2J` cleared the screen.
    const out = formatBackends([
      Backend.fromPartial({ id: 'e\x1b[2J', url: 'http://e:8000/\x1b]52;c;cm0gLXJmIH4=\x07', healthy: false, unusableReason: 'it serves model "x\nid: not usable: forged\x1b[31m"' }),
    ]);
    expect(out).not.toMatch(/[\x00-\x08\x0b-\x1f\x7f-\x9f]/);
    const [table, reasons] = out.split('\n\n');
    // One header and one row: a line break in a cell does not make a row of its own.
    expect(table!.split('\n')).toHaveLength(2);
    expect(table).toContain('e\\x1b[2J');
    expect(table).toContain('http://e:8000/\\x1b]52;c;cm0gLXJmIH4=\\x07');
    expect(reasons!.split('\n')).toEqual(['e\\x1b[2J: not usable: it serves model "x\\nid: not usable: forged\\x1b[31m"']);
  });
});
