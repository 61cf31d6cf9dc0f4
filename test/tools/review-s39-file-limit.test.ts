import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { createBashTool } from '../../src/tools/bash-tool.js';
import { createEditorTool } from '../../src/tools/editor-tool.js';
import { executeToolCalls } from '../../src/tools/execute.js';
import { createPythonTool } from '../../src/tools/python-tool.js';
import type { Tool, ToolContext } from '../../src/tools/types.js';
import { testSpec } from '../sandboxes/helpers.js';

/**
 * Review s39: a file the model asks a tool to write past the sandbox's per-file limit (maxFileMb, RLIMIT_FSIZE) got the
 * writer killed by SIGXFSZ, which the sandbox reports as sandbox_error: the editor and the python tool threw it, and the
 * trajectory failed as SANDBOX_ERROR (infrastructure) for the model's own request. It is an error observation now.
 */
describe('tools writing past the sandbox per-file limit', () => {
  let sandbox: BubblewrapSandbox;
  let context: ToolContext;
  const MIB = 1024 * 1024;
  const tools: Tool[] = [createEditorTool(), createBashTool({ timeoutMs: 10_000 }), createPythonTool({ timeoutMs: 10_000 })];
  const call = async (name: string, args: Record<string, unknown>) => {
    const [observation] = await executeToolCalls({ calls: [{ name, arguments: args }], errors: [] }, tools, context);
    return observation!;
  };

  beforeAll(async () => {
    sandbox = await new BubblewrapDriver().start(testSpec({ maxFileMb: 1 }));
    context = { sandbox, signal: new AbortController().signal };
  });
  afterAll(async () => {
    await sandbox?.stop();
  });

  it('editor create of a file over the limit is an error observation, and one of exactly the limit is written', async () => {
    expect(await call('str_replace_editor', { command: 'create', path: 'big.txt', file_text: 'x'.repeat(MIB + 1) })).toEqual({
      toolName: 'str_replace_editor',
      outcome: 'error',
      output: `Error: /work/big.txt would be ${MIB + 1} bytes, over the sandbox's limit of 1 MiB per file; nothing was written.`,
    });
    // Bytes count, not characters: 2-byte characters past the limit in bytes though not in characters.
    expect(await call('str_replace_editor', { command: 'create', path: 'wide.txt', file_text: 'é'.repeat(MIB / 2 + 1) })).toMatchObject({ outcome: 'error', output: expect.stringMatching(/over the sandbox's limit of 1 MiB per file/) });
    expect(await call('str_replace_editor', { command: 'create', path: 'exact.txt', file_text: 'x'.repeat(MIB) })).toMatchObject({ outcome: 'ok' });
    expect((await call('bash', { command: 'ls big.txt wide.txt 2>&1; wc -c < exact.txt' })).output).toMatch(/No such file[\s\S]*No such file[\s\S]*\n1048576$/);
  });

  it('str_replace and insert that would grow a file past the limit leave it as it was, with an error observation', async () => {
    expect(await call('bash', { command: `head -c ${MIB - 10} /dev/zero | tr '\\0' 'a' > near.txt; printf 'MARK\\n' >> near.txt` })).toMatchObject({ outcome: 'ok' });
    const grow = await call('str_replace_editor', { command: 'str_replace', path: 'near.txt', old_str: 'MARK', new_str: 'y'.repeat(100) });
    expect(grow).toMatchObject({ outcome: 'error', output: expect.stringMatching(/^Error: \/work\/near\.txt would be 1048667 bytes, over the sandbox's limit of 1 MiB per file; nothing was written\.$/) });
    const insert = await call('str_replace_editor', { command: 'insert', path: 'near.txt', insert_line: 1, new_str: 'z'.repeat(100) });
    expect(insert).toMatchObject({ outcome: 'error', output: expect.stringMatching(/over the sandbox's limit of 1 MiB per file/) });
    expect((await call('bash', { command: 'wc -c < near.txt; tail -c 5 near.txt' })).output).toBe(`${MIB - 5}\nMARK`);
    // Nothing was remembered for undo: there was no edit.
    expect(await call('str_replace_editor', { command: 'undo_edit', path: 'near.txt' })).toMatchObject({ outcome: 'error', output: expect.stringMatching(/no edit of/) });
  });

  it('python code over the limit is an error observation, and the next cell runs', async () => {
    const big = await call('python', { code: `# ${'x'.repeat(MIB)}\nprint(1)` });
    expect(big).toMatchObject({ toolName: 'python', outcome: 'error', output: expect.stringMatching(/^Error: could not write the code cell: \/work\/\.rollout\/python\/cell_\d+\.py would be \d+ bytes, over the sandbox's limit of 1 MiB per file; nothing was written\.$/) });
    expect(await call('python', { code: 'print(6 * 7)' })).toMatchObject({ outcome: 'ok', output: '42' });
  });
});

describe('undo_edit of a file larger than the per-file limit (one the sandbox was given, edited smaller)', () => {
  let sandbox: BubblewrapSandbox | undefined;
  let dir: string;
  afterAll(async () => {
    await sandbox?.stop();
    await rm(dir, { recursive: true, force: true });
  });

  it('is an error observation, not a write killed by SIGXFSZ', async () => {
    dir = await mkdtemp(join(tmpdir(), 'review-s39-undo-'));
    await chmod(dir, 0o777);
    // 1.4 MB in UTF-8 but 700,004 characters: its old version fits the undo history (1 Mi characters), not the file limit.
    await writeFile(join(dir, 'wide.txt'), `${'é'.repeat(700_000)}MARK`);
    await chmod(join(dir, 'wide.txt'), 0o666);
    sandbox = await new BubblewrapDriver().start({ ...testSpec({ maxFileMb: 1 }), mounts: [{ source: dir, target: '/data', readOnly: false }] });
    const tools = [createEditorTool()];
    const context = { sandbox, signal: new AbortController().signal };
    const call = async (args: Record<string, unknown>) => (await executeToolCalls({ calls: [{ name: 'str_replace_editor', arguments: args }], errors: [] }, tools, context))[0]!;
    expect(await call({ command: 'str_replace', path: '/data/wide.txt', old_str: `${'é'.repeat(300_000)}MARK`, new_str: 'END' })).toMatchObject({ outcome: 'ok' });
    expect(await call({ command: 'undo_edit', path: '/data/wide.txt' })).toEqual({
      toolName: 'str_replace_editor',
      outcome: 'error',
      output: `Error: /data/wide.txt would be 1400004 bytes, over the sandbox's limit of 1 MiB per file; nothing was written.`,
    });
    expect(await readFile(join(dir, 'wide.txt'), 'utf8')).toBe(`${'é'.repeat(400_000)}END`);
  });
});
