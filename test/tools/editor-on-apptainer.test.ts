import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApptainerDriver } from '../../src/sandboxes/apptainer.js';
import type { Sandbox } from '../../src/sandboxes/types.js';
import { createEditorTool } from '../../src/tools/editor-tool.js';
import type { ToolContext } from '../../src/tools/types.js';
import { makeApptainerDouble } from '../sandboxes/apptainer-double.js';
import { testSpec } from '../sandboxes/helpers.js';

/**
 * The editor on the Apptainer driver (over its TEST DOUBLE, bwrap-backed), whose file errors are worded unlike
 * bubblewrap's: reading a directory is "not a regular file" there. The editor must not depend on the wording.
 */
describe('str_replace_editor on an apptainer sandbox', () => {
  const double = makeApptainerDouble();
  const driver = new ApptainerDriver({ binary: double.binary, tmpRoot: double.tmpRoot });
  let sandbox: Sandbox;
  let context: ToolContext;
  const editor = createEditorTool();
  const edit = (args: Record<string, unknown>) => editor.run(args, context);
  beforeAll(async () => {
    sandbox = await driver.start(testSpec({ image: '/' }));
    context = { sandbox, signal: new AbortController().signal };
  });
  afterAll(async () => {
    await sandbox?.stop();
    await double.cleanup();
  });

  it('lists a directory on view, and still reports a missing path or a file in the way', async () => {
    expect(await edit({ command: 'create', path: 'src/a.py', file_text: 'x = 1\n' })).toMatchObject({ outcome: 'ok' });
    expect(await edit({ command: 'view', path: 'src' })).toEqual({ output: '/work/src/ (1 entries)\na.py  (6 bytes)', outcome: 'ok' });
    expect(await edit({ command: 'view', path: 'src/a.py' })).toEqual({ output: '     1\tx = 1', outcome: 'ok' });
    expect(await edit({ command: 'view', path: 'src/missing' })).toMatchObject({ outcome: 'error', output: expect.stringMatching(/no such file/) });
    expect(await edit({ command: 'view', path: 'src/a.py/b' })).toMatchObject({ outcome: 'error' });
  });
});
