import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { createPythonTool } from '../../src/tools/python-tool.js';
import type { ToolContext } from '../../src/tools/types.js';
import { testSpec } from '../sandboxes/helpers.js';

describe('python tool', () => {
  let sandbox: BubblewrapSandbox;
  let context: ToolContext;
  const python = createPythonTool({ timeoutMs: 1_500 });

  beforeAll(async () => {
    sandbox = await new BubblewrapDriver().start(testSpec({ outputLimitBytes: 4096 }));
    context = { sandbox, signal: new AbortController().signal };
  });

  afterAll(async () => {
    await sandbox?.stop();
  });

  it('declares a `code` string argument', () => {
    expect(python.parameters).toMatchObject({ type: 'object', properties: { code: { type: 'string' } }, required: ['code'] });
    expect(python.parameters).not.toHaveProperty('$schema');
  });

  it('returns stdout for a program that succeeds', async () => {
    expect(await python.run({ code: 'print(6 * 7)' }, context)).toEqual({ output: '42', outcome: 'ok' });
    expect(await python.run({ code: 'x = 1' }, context)).toEqual({ output: '(no output)', outcome: 'ok' });
  });

  it('shows stderr and the exit code of a failing program, as an error outcome', async () => {
    const result = await python.run({ code: 'print("before")\nraise ValueError("boom")' }, context);
    expect(result.outcome).toBe('error');
    expect(result.output).toMatch(/^before\n\[stderr\]\nTraceback[\s\S]*cell_\d+\.py", line 2[\s\S]*ValueError: boom\n\[exit code 1\]$/);
  });

  it('does nothing in the sandbox for a sample already cancelled, not even writing the code cell', async () => {
    const cancelled = new AbortController();
    cancelled.abort();
    const cells = async (): Promise<string> => (await sandbox.exec(['sh', '-c', 'ls -A .rollout/python 2>/dev/null'])).stdout;
    const before = await cells();
    await expect(python.run({ code: 'print(1)' }, { sandbox, signal: cancelled.signal })).rejects.toMatchObject({ code: 'cancelled' });
    expect(await cells()).toBe(before);
  });

  it('notes a timeout and kills the program', async () => {
    const result = await python.run({ code: 'import time\nprint("start", flush=True)\nwhile True: time.sleep(0.05)' }, context);
    expect(result.outcome).toBe('error');
    expect(result.output).toMatch(/^start\n\[timed out after 1\.\d s; the program was killed\]$/);
  });

  it('reports a program that exited with its status and output, not as timed out, when a child it started holds its output open', async () => {
    // The child inherits stdout and outlives the program: the pipe stays open, which used to read as a timeout.
    const result = await python.run({ code: 'import subprocess\nsubprocess.Popen(["sleep", "30"])\nprint("done")' }, context);
    expect(result).toEqual({
      output: 'done\n[the program exited, but a process it started is still running and holds its output: what that process prints is not shown]',
      outcome: 'ok',
    });
    const failed = await python.run({ code: 'import subprocess, sys\nsubprocess.Popen(["sleep", "30"])\nsys.exit(4)' }, context);
    expect(failed).toMatchObject({ outcome: 'error', output: expect.stringMatching(/^\[the program exited, .*\]\n\[exit code 4\]$/) });
  });

  it('notes truncated output', async () => {
    const result = await python.run({ code: 'print("y" * 100_000)' }, context);
    expect(result.outcome).toBe('ok');
    expect(result.output).toMatch(/^y{4096}\n\[output truncated/);
  });

  it('can import modules the model wrote in the work dir, and files persist between calls', async () => {
    await python.run({ code: 'open("helper.py", "w").write("def f():\\n    return 5\\n")' }, context);
    expect(await python.run({ code: 'import helper\nprint(helper.f())' }, context)).toEqual({ output: '5', outcome: 'ok' });
  });

  it('reports wrong argument types as an error result when called directly', async () => {
    const result = await python.run({ code: 3 }, context);
    expect(result.outcome).toBe('error');
    expect(result.output).toMatch(/invalid arguments for python: "code"/);
  });
});

describe('python tool: a model that breaks its own cell directory', () => {
  it('gets an error observation, not a failed task', async () => {
    const driver = new BubblewrapDriver();
    const sandbox = await driver.start(testSpec({ maxProcesses: 32, wallClockMs: 60_000, outputLimitBytes: 16_384 }));
    try {
      const tool = createPythonTool();
      const signal = new AbortController().signal;
      // The model replaces the hidden cell directory with a file...
      const first = await tool.run({ code: "import shutil, os\nshutil.rmtree('/work/.rollout')\nopen('/work/.rollout', 'w').write('x')\nprint('done')" }, { sandbox, signal });
      expect(first.outcome).toBe('ok');
      // ...so the next cell cannot be written: an observation it can act on.
      const second = await tool.run({ code: 'print(1)' }, { sandbox, signal });
      expect(second.outcome).toBe('error');
      expect(second.output).toMatch(/could not write the code cell/);
    } finally {
      await sandbox.stop();
    }
  });
});
