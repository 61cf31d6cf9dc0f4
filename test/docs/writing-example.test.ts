import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import type { Environment } from '../../src/environments/types.js';
import { hermesToolCall, latestToolResponse, type FakePolicy } from '../../src/testing/scripted-policy.js';
import { collect } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

/**
 * docs/environments/writing.md's complete example, exactly as the page shows it: the first ```ts block after the
 * "tested by" marker is written to a file inside the project (so `import ... from 'rollout-service'` resolves to this
 * package, as it would for a user), type-checked with the project's compiler options, imported, registered, and run
 * through a real server with real sandboxes.
 */
const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const page = join(root, 'docs/environments/writing.md');

async function exampleSource(): Promise<string> {
  const text = await readFile(page, 'utf8');
  const marker = text.indexOf('<!-- tested by test/docs/writing-example.test.ts');
  const block = /```ts\n([\s\S]*?)\n```/.exec(text.slice(marker));
  if (marker < 0 || !block) throw new Error(`no tested example in ${page}`);
  return `${block[1]!}\n`;
}

function typeErrors(file: string): string[] {
  const config = ts.getParsedCommandLineOfConfigFile(join(root, 'tsconfig.json'), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: () => undefined });
  const program = ts.createProgram([file], { ...config!.options, noEmit: true });
  return ts.getPreEmitDiagnostics(program, program.getSourceFile(file)).map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'));
}

/** Counts with bash, then submits what wc printed. */
const counter: FakePolicy = (prompt) => {
  const observed = latestToolResponse(prompt);
  if (observed === undefined) return hermesToolCall('bash', { command: 'wc -w < input.txt' });
  return hermesToolCall('finish', { answer: observed.trim() });
};

describe('the example of docs/environments/writing.md', () => {
  let dir: string;
  let file: string;
  let h: ServerHarness | undefined;
  beforeAll(async () => {
    await mkdir(join(root, '.cache'), { recursive: true });
    dir = await mkdtemp(join(root, '.cache', 'docs-example-'));
    file = join(dir, 'word-count.ts');
    await writeFile(file, await exampleSource());
  });
  afterAll(async () => {
    await h?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('type-checks as written', () => {
    expect(typeErrors(file)).toEqual([]);
  }, 120_000);

  it('registers, validates by field, is listed with its schema, and scores episodes through a real server', async () => {
    const { wordCount } = (await import(file)) as { wordCount: Environment };
    h = await startServerHarness({ engine: { policy: counter }, registry: defaultRegistry().register(wordCount) });
    const listed = (await h.client.listEnvironments()).environments.find((e) => e.name === 'word-count');
    expect(listed).toMatchObject({ tools: ['bash', 'finish'], instanceSchema: { required: ['text'] } });

    const session = h.client.openSession();
    const bad = await session.submit({ taskId: 'wc-bad', environment: 'word-count', numSamples: 1, instance: { hint: true } }).catch((e: unknown) => e);
    expect(bad).toMatchObject({ field: 'instance.text' });
    await session.submit({ taskId: 'wc', environment: 'word-count', numSamples: 2, instance: { text: 'the quick brown fox\njumps over the lazy dog' } });
    session.close();
    const trajectories = await collect(session.trajectories());
    expect(trajectories).toHaveLength(2);
    for (const t of trajectories) {
      expect(t.status, t.error).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
      expect(t).toMatchObject({ reward: 1, rewardDetails: { correct: 1, answered: 1 }, evalReport: { expected: 9, answer: '9', finish_reason: 'finish_tool' } });
    }
  });
});
