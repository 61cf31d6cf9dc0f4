import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createBashTool } from '../../src/tools/bash-tool.js';
import { disposeTools } from '../../src/tools/dispose-tools.js';
import { createEditorTool } from '../../src/tools/editor-tool.js';
import type { Tool, ToolContext } from '../../src/tools/types.js';
import { HostProcessSandbox } from '../../src/testing/host-process-sandbox.js';
import { testSpec } from '../sandboxes/helpers.js';

// Tool logic on the host-process TEST DOUBLE (no isolation).
describe('bash and str_replace_editor tools', () => {
  let sandbox: HostProcessSandbox;
  let context: ToolContext;
  const bash = createBashTool({ timeoutMs: 500 });
  const editor = createEditorTool();
  const edit = (args: Record<string, unknown>) => editor.run(args, context);

  beforeAll(async () => {
    sandbox = await HostProcessSandbox.create(testSpec({ outputLimitBytes: 4096 }));
    context = { sandbox, signal: new AbortController().signal };
  });
  afterAll(async () => {
    await sandbox?.stop();
  });

  it('bash keeps the cwd between calls and notes a non-zero exit code as an error', async () => {
    expect(await bash.run({ command: 'mkdir -p d && cd d && echo in' }, context)).toEqual({ output: 'in', outcome: 'ok' });
    expect(await bash.run({ command: 'basename "$PWD"; exit_now() { return 4; }; exit_now' }, context)).toEqual({ output: 'd\n[exit code 4]', outcome: 'error' });
    await bash.run({ command: 'cd ..' }, context);
  });

  it('bash says when a command timed out and when the shell was restarted', async () => {
    const timedOut = await bash.run({ command: 'sleep 10' }, context);
    expect(timedOut.outcome).toBe('error');
    expect(timedOut.output).toMatch(/\[timed out after 0\.5 s; the command was interrupted\]$/);
    const exited = await bash.run({ command: 'exit 2' }, context);
    expect(exited.output).toMatch(/^\[exit code 2\]\n\[the shell was restarted: variables, functions and background jobs are gone; working directory is \//);
  });

  it('bash reports a missing command argument as invalid', () => {
    expect((bash as Tool & { validate: (a: Record<string, unknown>) => { ok: boolean } }).validate({})).toMatchObject({ ok: false });
  });

  it('create writes a new file and refuses to overwrite an existing one', async () => {
    expect(await edit({ command: 'create', path: 'a.py', file_text: 'x = 1\ny = 2\n' })).toMatchObject({ outcome: 'ok' });
    const again = await edit({ command: 'create', path: 'a.py', file_text: 'other' });
    expect(again).toMatchObject({ outcome: 'error', output: expect.stringMatching(/already exists/) });
    expect(await sandbox.readFile(`${sandbox.workdir}/a.py`)).toBe('x = 1\ny = 2\n');
  });

  it('view numbers lines, honours view_range and lists directories', async () => {
    expect((await edit({ command: 'view', path: 'a.py' })).output).toBe('     1\tx = 1\n     2\ty = 2');
    expect((await edit({ command: 'view', path: 'a.py', view_range: [2, -1] })).output).toBe('     2\ty = 2');
    expect(await edit({ command: 'view', path: 'a.py', view_range: [3, 4] })).toMatchObject({ outcome: 'error', output: expect.stringMatching(/not within the file's 2 lines/) });
    const listing = await edit({ command: 'view', path: '.' });
    expect(listing.output).toMatch(/a\.py {2}\(12 bytes\)/);
    expect(listing.output).toMatch(/^d\/$/m);
  });

  it('view pages a large file with a note saying how to see the rest', async () => {
    await sandbox.writeFile(`${sandbox.workdir}/big.txt`, Array.from({ length: 1000 }, (_, i) => `line ${i + 1}`).join('\n'));
    const page = await edit({ command: 'view', path: 'big.txt' });
    expect(page.output).toMatch(/^ {5}1\tline 1\n/);
    expect(page.output).toMatch(/\[showing lines 1-300 of 1000; view with view_range \[301, 600\] for more\]$/);
  });

  it('str_replace needs exactly one occurrence and names the count and lines otherwise; new_str may be empty', async () => {
    expect(await edit({ command: 'str_replace', path: 'a.py', old_str: 'z', new_str: 'q' })).toMatchObject({ outcome: 'error', output: expect.stringMatching(/does not occur/) });
    expect(await edit({ command: 'str_replace', path: 'a.py', old_str: ' = ', new_str: '=' })).toMatchObject({
      outcome: 'error',
      output: expect.stringMatching(/occurs 2 times in .* \(lines 1, 2\); nothing was replaced/),
    });
    expect(await edit({ command: 'str_replace', path: 'a.py', old_str: 'y = 2\n', new_str: '' })).toMatchObject({ outcome: 'ok' });
    expect(await sandbox.readFile(`${sandbox.workdir}/a.py`)).toBe('x = 1\n');
  });

  it('insert puts text after the given line, refuses a line past the end, and undo_edit reverts edits in order', async () => {
    expect(await edit({ command: 'insert', path: 'a.py', insert_line: 0, new_str: 'import os' })).toMatchObject({ outcome: 'ok' });
    expect(await sandbox.readFile(`${sandbox.workdir}/a.py`)).toBe('import os\nx = 1\n');
    expect(await edit({ command: 'insert', path: 'a.py', insert_line: 9, new_str: 'z' })).toMatchObject({ outcome: 'error', output: expect.stringMatching(/has 2 lines \(use 0\.\.2\)/) });
    await edit({ command: 'undo_edit', path: 'a.py' });
    expect(await sandbox.readFile(`${sandbox.workdir}/a.py`)).toBe('x = 1\n');
    await edit({ command: 'undo_edit', path: 'a.py' });
    expect(await sandbox.readFile(`${sandbox.workdir}/a.py`)).toBe('x = 1\ny = 2\n');
    expect(await edit({ command: 'undo_edit', path: 'a.py' })).toMatchObject({ outcome: 'error', output: expect.stringMatching(/no edit/) });
  });

  it('reports a missing file and missing per-command arguments as error observations', async () => {
    expect(await edit({ command: 'view', path: 'nope.txt' })).toMatchObject({ outcome: 'error', output: expect.stringMatching(/no such file/) });
    expect(await edit({ command: 'create', path: 'b.txt' })).toMatchObject({ outcome: 'error', output: expect.stringMatching(/file_text.*required for command "create"/) });
  });
});

describe('disposeTools', () => {
  it('disposes every tool that can be disposed, logs failures and never throws', async () => {
    const disposed: string[] = [];
    const errors: unknown[] = [];
    const tool = (name: string, fail = false): Tool => ({
      name,
      description: '',
      parameters: {},
      run: async () => ({ output: '', outcome: 'ok' }),
      dispose: async () => {
        disposed.push(name);
        if (fail) throw new Error(`${name} broke`);
      },
    });
    const plain: Tool = { name: 'plain', description: '', parameters: {}, run: async () => ({ output: '', outcome: 'ok' }) };
    const log = { error: (obj: unknown) => errors.push(obj) } as unknown as Parameters<typeof disposeTools>[1];
    await disposeTools([tool('a', true), plain, tool('b')], log);
    expect(disposed.sort()).toEqual(['a', 'b']);
    expect(errors).toHaveLength(1);
  });

  it('gives up on a dispose that never ends after its bound, logging it, so the sample keeps its own result', { timeout: 5_000 }, async () => {
    // A plugin's tool whose clean-up hangs (a connection to a dead service) held its sample until the run stage's
    // deadline turned a finished trajectory into TIMEOUT.
    const logged: unknown[] = [];
    let finished = false;
    const hanging: Tool = { name: 'hangs', description: '', parameters: {}, run: async () => ({ output: '', outcome: 'ok' }), dispose: () => new Promise<void>(() => undefined) };
    const quick: Tool = { name: 'quick', description: '', parameters: {}, run: async () => ({ output: '', outcome: 'ok' }), dispose: async () => void (finished = true) };
    const log = { error: (obj: unknown, msg: string) => logged.push([obj, msg]) } as unknown as Parameters<typeof disposeTools>[1];
    await disposeTools([hanging, quick], log, { timeoutMs: 50 });
    expect(finished).toBe(true);
    expect(logged).toEqual([[{ tool: 'hangs', timeoutMs: 50 }, 'disposing a tool did not finish in time; left behind']]);
  });
});
