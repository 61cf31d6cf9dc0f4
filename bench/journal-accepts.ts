/**
 * Accepts per second with and without the durable journal: how much the fsync before TaskAccepted costs, on one
 * Rollout stream (each task waits for the previous one's acceptance: one fsync per task) and over many concurrent
 * callers (their accepts share commits and fsyncs). Tasks run on the fake vLLM engine (a test double) at a slow
 * token latency, so the figure is acceptance, not rollout work. Prints figures; asserts nothing.
 *
 *   npx tsx bench/journal-accepts.ts [--tasks 2000] [--callers 64] [--dir /tmp]
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startRolloutServer } from '../src/app.js';
import { RolloutClient } from '../src/client/rollout-client.js';
import { silentLogger } from '../src/observability/logger.js';
import { NullSandboxDriver } from '../src/testing/null-sandbox.js';
import { FakeVllmEngine } from '../src/testing/fake-vllm.js';
import { loadQwen3 } from '../src/tokens/tokenizer.js';
import { mathTask } from '../test/support/harness.js';
import { Journal } from '../src/journal/journal.js';
import { TaskSpec } from '../gen/ts/rollout/v1/rollout.js';

const { values } = parseArgs({ options: { tasks: { type: 'string', default: '2000' }, callers: { type: 'string', default: '64' }, dir: { type: 'string', default: tmpdir() } } });
const tasks = Number(values.tasks);
const callers = Number(values.callers);

const engine = await FakeVllmEngine.start({ tokenizer: (await loadQwen3()).tokenizer, tokenLatencyMs: 1_000 });

async function measure(journalDir: string | null): Promise<{ stream: number; concurrent: number }> {
  const server = await startRolloutServer(
    { port: 0, backends: [{ url: engine.url, model: engine.model }], model: engine.model, maxAdmitted: 4 * tasks, init: { concurrency: 1 }, journal: { dir: journalDir } },
    { logger: silentLogger(), sandboxes: new NullSandboxDriver() },
  );
  const client = new RolloutClient(server.address);
  try {
    const session = client.openSession();
    await session.opened;
    let t0 = performance.now();
    await Promise.all(Array.from({ length: tasks }, (_, i) => session.submit(mathTask(`s-${i}`, 1, i))));
    const stream = tasks / ((performance.now() - t0) / 1000);
    session.abort();
    t0 = performance.now();
    let next = 0;
    await Promise.all(
      Array.from({ length: callers }, async () => {
        while (next < tasks) await client.submit(mathTask(`u-${next++}`, 1, next));
      }),
    );
    const concurrent = tasks / ((performance.now() - t0) / 1000);
    return { stream, concurrent };
  } finally {
    client.close();
    await server.shutdown();
  }
}

/** The journal alone (no server): one accept at a time (an fsync each) and all at once (shared commits). */
async function journalAlone(dir: string): Promise<{ stream: number; concurrent: number }> {
  const { journal } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
  const spec = TaskSpec.encode(TaskSpec.fromPartial(mathTask('x', 1, 1))).finish();
  let t0 = performance.now();
  for (let i = 0; i < tasks; i++) await journal.accepted(`s-${i}`, spec, 1, '');
  const stream = tasks / ((performance.now() - t0) / 1000);
  t0 = performance.now();
  await Promise.all(Array.from({ length: tasks }, (_, i) => journal.accepted(`c-${i}`, spec, 1, '')));
  const concurrent = tasks / ((performance.now() - t0) / 1000);
  await journal.close();
  return { stream, concurrent };
}

const dir = await mkdtemp(join(values.dir, 'rollout-journal-bench-'));
try {
  const alone = await journalAlone(join(dir, 'alone'));
  const without = await measure(null);
  const withJournal = await measure(join(dir, 'journal'));
  const row = (name: string, r: { stream: number; concurrent: number }): string => `| ${name} | ${r.stream.toFixed(0)} | ${r.concurrent.toFixed(0)} |`;
  console.log(`accepts/s, ${tasks} tasks of 1 sample (journal on ${values.dir})\n`);
  console.log(`| | one stream (sequential) | ${callers} concurrent unary Submits |`);
  console.log('| --- | --- | --- |');
  console.log(row('no journal', without));
  console.log(row('journal (fsync before TaskAccepted)', withJournal));
  console.log(`\nthe journal alone: ${alone.stream.toFixed(0)} accepts/s one at a time, ${alone.concurrent.toFixed(0)} accepts/s ${tasks} at once`);
} finally {
  await engine.close();
  await rm(dir, { recursive: true, force: true });
}
process.exit(0);
