import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool } from '../../src/tools/define-tool.js';

const args = z.object({ page: z.number().int().min(0).describe('page number') });
const tool = (name: string, schema: z.ZodObject = args) =>
  defineTool({ name, description: 'd', args: schema, run: async (a) => ({ output: JSON.stringify(a), outcome: 'ok' }) });

describe('defineTool', () => {
  it("derives the schema's JSON Schema once and shares it, frozen, between tools built from the same schema", () => {
    const a = tool('a');
    const b = tool('b');
    const { $schema: _ignored, ...expected } = z.toJSONSchema(args) as Record<string, unknown>;
    expect(a.parameters).toEqual(expected);
    expect(a.parameters).toBe(b.parameters);
    expect(Object.isFrozen(a.parameters)).toBe(true);
    expect(Object.isFrozen((a.parameters.properties as Record<string, unknown>).page)).toBe(true);
    expect(() => {
      (a.parameters as Record<string, unknown>).type = 'array';
    }).toThrow(TypeError);
  });

  it('gives another schema its own JSON Schema', () => {
    const other = z.object({ text: z.string() });
    expect(tool('c', other).parameters).not.toBe(tool('a').parameters);
    expect(tool('c', other).parameters.properties).toEqual({ text: { type: 'string' } });
  });

  it('still validates and runs each tool with its own closure', async () => {
    const t = tool('a');
    expect(t.validate({ page: 2 })).toEqual({ ok: true, args: { page: 2 } });
    expect(t.validate({ page: -1 })).toMatchObject({ ok: false });
    await expect(t.run({ page: 'x' }, {} as never)).resolves.toMatchObject({ outcome: 'error' });
    await expect(t.run({ page: 3 }, {} as never)).resolves.toEqual({ output: '{"page":3}', outcome: 'ok' });
  });
});
