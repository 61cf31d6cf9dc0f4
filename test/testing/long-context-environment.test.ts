import { describe, expect, it } from 'vitest';
import {
  createLongContextEnvironment,
  forgetPreparedLongContext,
  logText,
  prepareLongContext,
  type LongContextInstance,
} from '../../src/testing/long-context-environment.js';

const instance = (seed: number): LongContextInstance => ({ seed, promptChars: 20_000, pages: 3, pageChars: 900 });

describe('long-context double', () => {
  it('returns the same texts whether they were prepared ahead or generated on demand', async () => {
    const env = createLongContextEnvironment();
    const read = async (i: LongContextInstance): Promise<string[]> => {
      const [tool] = env.tools(i);
      const pages = [];
      for (let page = 0; page < i.pages; page++) pages.push((await tool!.run({ page }, {} as never)).output);
      return [env.prompt!(i).map((m) => m.content).join('\n'), ...pages];
    };
    const onDemand = await read(instance(41));
    forgetPreparedLongContext();
    expect(prepareLongContext([instance(41), instance(42)])).toBe(2 * (20_000 + 3 * 900));
    const prepared = await read(instance(41));
    expect(prepared).toEqual(onDemand);
    expect(prepared[0]).toContain(logText(41, 20_000));
    expect(new Set(prepared.slice(1)).size).toBe(3);
    expect(prepared.slice(1).every((p) => p.length === 900)).toBe(true);
    forgetPreparedLongContext();
  });
});
