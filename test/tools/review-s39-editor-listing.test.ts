import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { createBashTool } from '../../src/tools/bash-tool.js';
import { createEditorTool } from '../../src/tools/editor-tool.js';
import { executeToolCalls } from '../../src/tools/execute.js';
import type { Tool, ToolContext } from '../../src/tools/types.js';
import { testSpec } from '../sandboxes/helpers.js';

/**
 * Review s39: `view` of a directory showed up to 200 entries whatever their length. Names run to 255 bytes, so one
 * bash loop of the model's made every later listing ~52 KB (over three times the 20,000 characters a file view is cut
 * at, and the sandbox's 16 KiB output cap on `ls`). The listing is cut at the view's character bound too, and says so.
 */
describe('str_replace_editor directory listing bound', () => {
  let sandbox: BubblewrapSandbox;
  let context: ToolContext;
  const tools: Tool[] = [createEditorTool(), createBashTool({ timeoutMs: 20_000 })];
  const call = async (name: string, args: Record<string, unknown>) => {
    const [observation] = await executeToolCalls({ calls: [{ name, arguments: args }], errors: [] }, tools, context);
    return observation!;
  };

  beforeAll(async () => {
    sandbox = await new BubblewrapDriver().start(testSpec());
    context = { sandbox, signal: new AbortController().signal };
  });
  afterAll(async () => {
    await sandbox?.stop();
  });

  it('lists a directory of long names in at most 20,000 characters, counting the entries left out', async () => {
    expect(await call('bash', { command: 'mkdir /work/long && cd /work/long && for i in $(seq 150); do : > "$(printf "%0250d" "$i")"; done && ls | wc -l' })).toMatchObject({ outcome: 'ok', output: '150' });
    const listing = await call('str_replace_editor', { command: 'view', path: 'long' });
    expect(listing.outcome).toBe('ok');
    expect(listing.output.length).toBeLessThanOrEqual(20_000 + 200);
    const lines = listing.output.split('\n');
    expect(lines[0]).toBe('/work/long/ (150 entries)');
    const shown = lines.filter((l) => / {2}\(0 bytes\)$/.test(l)).length;
    expect(shown).toBeGreaterThan(0);
    expect(lines.at(-1)).toBe(`[${150 - shown} more entries not shown]`);
    // The first entries, in name order.
    expect(lines[1]).toBe(`${'1'.padStart(250, '0')}  (0 bytes)`);
  });

  it('still lists a directory of short names whole', async () => {
    await call('bash', { command: 'mkdir /work/short && cd /work/short && touch a b && mkdir c' });
    expect(await call('str_replace_editor', { command: 'view', path: 'short' })).toEqual({
      toolName: 'str_replace_editor',
      outcome: 'ok',
      output: '/work/short/ (3 entries)\na  (0 bytes)\nb  (0 bytes)\nc/',
    });
  });
});
