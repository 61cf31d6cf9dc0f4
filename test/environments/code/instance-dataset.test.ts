import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCodeEnvironment } from '../../../src/environments/code/code-environment.js';
import { loadCodeTasks } from '../../../src/environments/code/dataset.js';

const code = createCodeEnvironment();
const humanEval = { task_id: 'T/0', prompt: 'def add(a, b):\n    """Sum."""\n', test: 'def check(f):\n    assert f(1, 2) == 3\n', entry_point: 'add', canonical_solution: '    return a + b\n' };
const stdio = { statement: 'Print the sum of two numbers.', tests: [{ input: '1 2\n', output: '3\n' }] };

describe('code instances', () => {
  it('accepts both formats, normalised, with the documented defaults', () => {
    expect(code.validate(humanEval)).toEqual({ format: 'humaneval', taskId: 'T/0', prompt: humanEval.prompt, test: humanEval.test, entryPoint: 'add', timeoutS: 10, memoryLimitMb: 1024 });
    expect(code.validate({ ...stdio, time_limit_s: 1 })).toEqual({ format: 'stdio', taskId: undefined, prompt: stdio.statement, tests: stdio.tests, timeLimitS: 1, memoryLimitMb: 1024 });
  });

  it('names the field of the format the row is in', () => {
    expect(() => code.validate({ prompt: 'p', test: 't' })).toThrow(expect.objectContaining({ field: 'instance.entry_point', message: 'instance.entry_point: required' }));
    expect(() => code.validate({ ...humanEval, entry_point: 'not an identifier' })).toThrow(expect.objectContaining({ field: 'instance.entry_point' }));
    expect(() => code.validate({ prompt: 'p', tests: [{ input: '1' }] })).toThrow(expect.objectContaining({ field: 'instance.tests.0.output' }));
    expect(() => code.validate({ tests: [{ input: '1', output: '1' }] })).toThrow(expect.objectContaining({ field: 'instance.prompt', message: 'instance.prompt: required' }));
    expect(() => code.validate({ prompt: 'p', tests: [] })).toThrow(expect.objectContaining({ field: 'instance.tests' }));
    expect(() => code.validate({ ...stdio, time_limit_s: 0 })).toThrow(expect.objectContaining({ field: 'instance.time_limit_s' }));
    // Regression: any positive limit was taken; 0.0001 s (0 ms once rounded) made the Apptainer sandbox fail the exec as
    // its own wall-clock error, and a few ms timed every solution out (reward 0 for a broken task).
    for (const tiny of [0.0001, 0.001, 0.05]) {
      expect(() => code.validate({ ...stdio, time_limit_s: tiny })).toThrow(expect.objectContaining({ field: 'instance.time_limit_s', message: expect.stringContaining('at least 0.1 seconds') }));
      expect(() => code.validate({ ...humanEval, timeout_s: tiny })).toThrow(expect.objectContaining({ field: 'instance.timeout_s' }));
    }
    expect(code.validate({ ...stdio, time_limit_s: 0.1 })).toMatchObject({ timeLimitS: 0.1 });
  });

  // A keyword (or __debug__) can name no function: every solution would fail, reward 0 for a broken task.
  it('refuses an entry_point no Python function can have, naming instance.entry_point', () => {
    for (const entry_point of ['def', 'None', 'lambda', 'await', '__debug__', 'a\nb', 'x'.repeat(257)]) {
      expect(() => code.validate({ ...humanEval, entry_point }), entry_point.slice(0, 20)).toThrow(expect.objectContaining({ field: 'instance.entry_point' }));
    }
    expect(() => code.validate({ ...humanEval, entry_point: 'class' })).toThrow(expect.objectContaining({ message: expect.stringContaining('is a Python keyword') }));
    // Soft keywords are ordinary names.
    for (const entry_point of ['match', 'case', 'type', '_']) expect(code.validate({ ...humanEval, entry_point })).toMatchObject({ entryPoint: entry_point });
  });

  // Found by review (helper-37): a test without check(candidate) failed every solution, reward 0 for each sample of
  // a broken task instead of a refusal at submit.
  it('refuses a HumanEval-format test that defines no check function, naming instance.test', () => {
    for (const test of ['def chek(f):\n    assert f(1, 2) == 3\n', 'assert add(1, 2) == 3\n', 'checks = []\n']) {
      expect(() => code.validate({ ...humanEval, test }), test).toThrow(expect.objectContaining({ field: 'instance.test', message: expect.stringContaining('check(candidate)') }));
    }
    for (const test of ['def check(candidate):\n    assert candidate(1, 2) == 3\n', 'import math\n\nasync def check(f):\n    pass\n', 'check = lambda f: f(1, 2) == 3\n']) {
      expect(code.validate({ ...humanEval, test }), test).toMatchObject({ test });
    }
  });

  it('takes an optional float tolerance for stdin/stdout tasks: a number for both kinds, or {absolute, relative}', () => {
    expect(code.validate(stdio)).toMatchObject({ floatTolerance: undefined });
    expect(code.validate({ ...stdio, float_tolerance: 1e-6 })).toMatchObject({ floatTolerance: { absolute: 1e-6, relative: 1e-6 } });
    expect(code.validate({ ...stdio, float_tolerance: { relative: 1e-9 } })).toMatchObject({ floatTolerance: { relative: 1e-9 } });
    expect(code.validate({ ...stdio, float_tolerance: { absolute: 5, relative: 0 } })).toMatchObject({ floatTolerance: { absolute: 5, relative: 0 } });
    for (const bad of [-1e-6, 2, '1e-6', {}, { absolute: -1 }, { relative: 1.5 }, { abs: 1e-6 }]) {
      expect(() => code.validate({ ...stdio, float_tolerance: bad }), JSON.stringify(bad)).toThrow(expect.objectContaining({ field: expect.stringMatching(/^instance\.float_tolerance/) }));
    }
    // The prompt says how exact the output must be, so the model knows how many digits to print.
    expect(code.prompt!(code.validate({ ...stdio, float_tolerance: { absolute: 1e-6 } }))[1]!.content).toContain('accepted within an absolute error of 0.000001 of the expected ones');
    expect(code.prompt!(code.validate(stdio))[1]!.content).not.toContain('accepted within');
  });

  it('sizes the output cap of the sandbox to the largest expected output', () => {
    // minMemoryMb: the default memory_limit_mb (1024) and the judge's headroom (256).
    expect(code.sandbox!(code.validate(humanEval))).toEqual({ limits: { outputLimitBytes: 65536 }, minMemoryMb: 1280 });
    const big = code.validate({ prompt: 'p', tests: [{ input: '', output: 'x'.repeat(100_000) }] });
    expect(code.sandbox!(big)).toEqual({ limits: { outputLimitBytes: 204_096 }, minMemoryMb: 1280 });
  });
});

describe('loading code tasks from JSONL', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'code-tasks-'));
  });
  afterAll(async () => rm(dir, { recursive: true, force: true }));

  it('reads both formats from one file, plain or gzipped, skipping blank lines', async () => {
    const text = `${JSON.stringify(humanEval)}\n\n${JSON.stringify(stdio)}\n`;
    await writeFile(join(dir, 'tasks.jsonl'), text);
    await writeFile(join(dir, 'tasks.jsonl.gz'), gzipSync(text));
    for (const file of ['tasks.jsonl', 'tasks.jsonl.gz']) {
      const rows = await loadCodeTasks(join(dir, file));
      expect(rows).toEqual([
        { line: 1, instance: humanEval },
        { line: 3, instance: stdio },
      ]);
    }
  });

  it('fails on a bad row naming the file, line and field', async () => {
    const path = join(dir, 'bad.jsonl');
    await writeFile(path, `${JSON.stringify(humanEval)}\n${JSON.stringify({ prompt: 'p', tests: [{ input: 1, output: '' }] })}\n`);
    await expect(loadCodeTasks(path)).rejects.toMatchObject({ code: 'invalid_argument', field: `${path}:2.tests.0.input` });
    await writeFile(path, '{"prompt": \n');
    await expect(loadCodeTasks(path)).rejects.toMatchObject({ field: `${path}:1`, message: expect.stringContaining('not JSON') });
    await expect(loadCodeTasks(join(dir, 'missing.jsonl'))).rejects.toMatchObject({ code: 'not_found' });
  });
});
