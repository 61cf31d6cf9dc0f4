import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { createBashTool } from '../../src/tools/bash-tool.js';
import { createEditorTool } from '../../src/tools/editor-tool.js';
import { executeToolCalls } from '../../src/tools/execute.js';
import type { Tool, ToolContext } from '../../src/tools/types.js';
import { NullSandbox } from '../../src/testing/null-sandbox.js';
import { testSpec } from '../sandboxes/helpers.js';

/** The editor against what a model can make of its arguments and of the files, in a real bubblewrap sandbox. */
describe('str_replace_editor with hostile arguments and files', () => {
  let sandbox: BubblewrapSandbox;
  let context: ToolContext;
  const editor = createEditorTool();
  const bash = createBashTool({ timeoutMs: 5_000 });
  const tools: Tool[] = [editor, bash];
  const call = async (name: string, args: Record<string, unknown>) => {
    const [observation] = await executeToolCalls({ calls: [{ name, arguments: args }], errors: [] }, tools, context);
    return observation!;
  };
  const bytesOf = async (path: string): Promise<string> => (await call('bash', { command: `od -An -tx1 -v ${path} | tr -d ' \\n'` })).output;

  beforeAll(async () => {
    sandbox = await new BubblewrapDriver().start(testSpec());
    context = { sandbox, signal: new AbortController().signal };
  });
  afterAll(async () => {
    await sandbox?.stop();
  });

  it('answers a path too long for the kernel with an observation, not a failed trajectory', async () => {
    // Past 128 KiB one argv string cannot be passed to a new process at all (E2BIG): the file scripts never start.
    for (const path of ['x'.repeat(200_000), `/work/${'a/'.repeat(100_000)}f`]) {
      for (const command of ['view', 'create']) {
        const observation = await call('str_replace_editor', { command, path, file_text: 'x' });
        expect(observation.outcome).toBe('malformed');
        expect(observation.output).toMatch(/"path": .*longer than 4096 characters/);
      }
    }
    // A long path the kernel refuses by itself (a component over NAME_MAX) is the model's error too, as before.
    expect(await call('str_replace_editor', { command: 'create', path: 'y'.repeat(300), file_text: 'x' })).toMatchObject({ outcome: 'error' });
  });

  it('create says "already exists" only of what exists: a path whose existence cannot be checked is named as such', async () => {
    // The model made its workspace unenterable: the check failed for that reason, and nothing exists at the path.
    await call('bash', { command: 'chmod 000 /work' });
    try {
      const created = await call('str_replace_editor', { command: 'create', path: 'fresh.txt', file_text: 'x' });
      expect(created.outcome).toBe('error');
      expect(created.output).not.toMatch(/already exists/);
      expect(created.output).toMatch(/^Error: could not check whether \/work\/fresh\.txt exists, so nothing was created: .*\/work is not a directory or cannot be entered/);
    } finally {
      await call('bash', { command: 'chmod 755 /work' });
    }
    // What does exist is still refused, also when it cannot be read (a file without permissions, a directory).
    await call('bash', { command: 'mkdir -p made && echo secret > locked.txt && chmod 000 locked.txt' });
    for (const path of ['locked.txt', 'made']) {
      expect(await call('str_replace_editor', { command: 'create', path, file_text: 'x' })).toMatchObject({ outcome: 'error', output: expect.stringMatching(/already exists/) });
    }
    // And a missing file under a directory it cannot read is the write's own error, not "already exists".
    await call('bash', { command: 'mkdir -p shut && chmod 000 shut' });
    const shut = await call('str_replace_editor', { command: 'create', path: 'shut/new.txt', file_text: 'x' });
    expect(shut).toMatchObject({ outcome: 'error', output: expect.not.stringMatching(/already exists/) });
  });

  it('refuses to edit a file that is not valid UTF-8 instead of rewriting its other bytes', async () => {
    // Latin-1 "café" (0xe9): decoded as UTF-8 it reads U+FFFD, and writing that text back would change the byte.
    await call('bash', { command: "printf 'caf\\xe9 = 1\\nname = 2\\n' > latin.py" });
    const before = await bytesOf('latin.py');
    expect(before).toBe('636166e9203d20310a6e616d65203d20320a');
    const replaced = await call('str_replace_editor', { command: 'str_replace', path: 'latin.py', old_str: 'name', new_str: 'nome' });
    expect(replaced).toMatchObject({ outcome: 'error', output: expect.stringMatching(/latin\.py is not valid UTF-8 .*nothing was changed/) });
    const inserted = await call('str_replace_editor', { command: 'insert', path: 'latin.py', insert_line: 0, new_str: '# x' });
    expect(inserted).toMatchObject({ outcome: 'error', output: expect.stringMatching(/not valid UTF-8/) });
    expect(await bytesOf('latin.py')).toBe(before);
    // Valid UTF-8 with non-ASCII text is edited as usual.
    await call('bash', { command: "printf 'caf\\xc3\\xa9 = 1\\n' > utf8.py" });
    expect(await call('str_replace_editor', { command: 'str_replace', path: 'utf8.py', old_str: '1', new_str: '2' })).toMatchObject({ outcome: 'ok' });
    expect(await bytesOf('utf8.py')).toBe('636166c3a9203d20320a');
  });
});

describe('str_replace_editor undo history', () => {
  let sandbox: BubblewrapSandbox;
  let context: ToolContext;
  beforeAll(async () => {
    sandbox = await new BubblewrapDriver().start(testSpec());
    context = { sandbox, signal: new AbortController().signal };
  });
  afterAll(async () => {
    await sandbox?.stop();
  });

  it('holds a bounded amount per sandbox, forgetting the oldest versions first, however many files were edited', async () => {
    // The earlier versions live in the server's memory, one history per sample: edits of many files must not add up.
    const editor = createEditorTool();
    const edit = (args: Record<string, unknown>) => editor.run(args, context);
    const body = `${'x'.repeat(299_999)}\n`;
    for (let i = 0; i < 8; i++) {
      await sandbox.writeFile(`${sandbox.workdir}/f${i}.txt`, `start ${i}\n${body}`);
      expect(await edit({ command: 'str_replace', path: `f${i}.txt`, old_str: `start ${i}`, new_str: `edited ${i}` })).toMatchObject({ outcome: 'ok' });
    }
    expect(await edit({ command: 'undo_edit', path: 'f0.txt' })).toMatchObject({ outcome: 'error', output: expect.stringMatching(/no edit of \/work\/f0\.txt to undo/) });
    expect(await edit({ command: 'undo_edit', path: 'f7.txt' })).toMatchObject({ outcome: 'ok' });
    expect((await sandbox.readFile(`${sandbox.workdir}/f7.txt`)).startsWith('start 7\n')).toBe(true);
    // Small files keep their full depth.
    await sandbox.writeFile(`${sandbox.workdir}/s.txt`, 'v0\n');
    for (let v = 1; v <= 6; v++) await edit({ command: 'str_replace', path: 's.txt', old_str: `v${v - 1}`, new_str: `v${v}` });
    for (let v = 5; v >= 1; v--) {
      expect(await edit({ command: 'undo_edit', path: 's.txt' })).toMatchObject({ outcome: 'ok' });
      expect(await sandbox.readFile(`${sandbox.workdir}/s.txt`)).toBe(`v${v}\n`);
    }
    expect(await edit({ command: 'undo_edit', path: 's.txt' })).toMatchObject({ outcome: 'error' });
  });
});

describe('str_replace_editor on a file of millions of short lines', () => {
  it('views and edits it in time linear in the file, without an array of its lines (the event loop stalled for seconds)', async () => {
    // A model writes such a file with one command (16 MiB, the read limit); each edit ran on the server's event loop.
    const sandbox = new NullSandbox('lines', testSpec());
    const context = { sandbox, signal: new AbortController().signal };
    const editor = createEditorTool();
    const edit = (args: Record<string, unknown>) => editor.run(args, context);
    const lines = 16_000_000;
    await sandbox.writeFile('/work/nl.txt', `${'\n'.repeat(lines - 21)}${'q\n'.repeat(21)}`);
    const started = performance.now();
    const page = await edit({ command: 'view', path: 'nl.txt', view_range: [lines - 1, -1] });
    expect(page).toEqual({ output: `${String(lines - 1).padStart(6)}\tq\n${String(lines).padStart(6)}\tq`, outcome: 'ok' });
    const ambiguous = await edit({ command: 'str_replace', path: 'nl.txt', old_str: 'q', new_str: 'r' });
    expect(ambiguous.output).toMatch(new RegExp(`occurs more than 20 times .*\\(lines ${lines - 20}, ${lines - 19}, `));
    expect(await edit({ command: 'insert', path: 'nl.txt', insert_line: 2, new_str: 'inserted' })).toEqual({
      output: 'Inserted into /work/nl.txt. Around the edit:\n     1\t\n     2\t\n     3\tinserted\n     4\t\n     5\t\n     6\t\n     7\t',
      outcome: 'ok',
    });
    expect(await edit({ command: 'str_replace', path: 'nl.txt', old_str: '\ninserted\n', new_str: '\nreplaced\n' })).toMatchObject({ outcome: 'ok' });
    expect((await edit({ command: 'view', path: 'nl.txt' })).output).toMatch(/^ {5}1\t\n {5}2\t\n {5}3\treplaced\n[\s\S]*\[showing lines 1-300 of 16000001; /);
    // 12 s before (arrays of 16 million lines, a scan from the top per reported line); ~0.4 s now. The bound is 20x
    // that, so a loaded CI machine does not fail it, and still below what the old code took here.
    expect(performance.now() - started).toBeLessThan(8_000);
  });
});
