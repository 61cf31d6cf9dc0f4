/**
 * Soak: hours of training compressed into minutes — 2,000 trajectories in flight against the fake vLLM engine, a
 * kill -9 and restart of the server midway, then the accounting. See bench/README.md ("soak").
 *
 *   npx tsx bench/soak.ts [--minutes 10] [--concurrency 2000] [--kill-at 0.5] [--journal-dir DIR] [--quick]
 *
 * Exit code 1 when the accounting fails (a task lost with a journal, missing, delivered twice after its ack; a
 * sandbox, cgroup, mount or process left; a server that does not exit after SIGTERM). Timings are printed, never
 * judged.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command } from 'commander';
import { fraction, positiveNumber } from './options.js';
import { renderSoak } from './soak/print.js';
import { runSoak, type SoakOptions } from './soak/run.js';


const program = new Command()
  .name('soak')
  .description('The rollout server under sustained load with a kill -9 and restart midway: throughput, latency, memory over time, leaks, exactly-once accounting.')
  .option('--minutes <m>', 'length of the load phase', positiveNumber, 10)
  .option('--concurrency <n>', 'samples in flight', positiveNumber, 2000)
  .option('--sessions <n>', 'Rollout sessions sharing the load', positiveNumber, 8)
  .option('--group-size <n>', 'samples per task', positiveNumber, 1)
  .option('--sandbox-every <k>', 'every k-th task runs math with python in bubblewrap, the rest soak-calc in a null sandbox', positiveNumber, 50)
  .option('--kill-at <fraction>', 'kill -9 the server at this fraction of the load phase and restart it', fraction, 0.5)
  .option('--no-kill', 'no kill -9 step')
  .option('--journal-dir <dir>', "the server's durable journal (`rollout serve --journal-dir`), kept across the restart")
  .option('--sample-seconds <s>', 'server memory sampling interval', positiveNumber, 5)
  .option('--drain-timeout <s>', 'after the load phase, how long to wait for what is in flight', positiveNumber, 120)
  .option('--quick', 'validation run: 1 minute, 200 in flight, 2 sessions, sampled every 2 s')
  .option('--output <path>', 'JSON results', fileURLToPath(new URL('./results/soak.json', import.meta.url)))
  .parse();

const opts = program.opts<{
  minutes: number; concurrency: number; sessions: number; groupSize: number; sandboxEvery: number; killAt: number; kill: boolean;
  journalDir?: string; sampleSeconds: number; drainTimeout: number; quick?: boolean; output: string;
}>();
const quick = opts.quick === true;
const set = (name: string): boolean => program.getOptionValueSource(name) === 'cli';
const options: SoakOptions = {
  minutes: quick && !set('minutes') ? 1 : opts.minutes,
  concurrency: quick && !set('concurrency') ? 200 : opts.concurrency,
  sessions: quick && !set('sessions') ? 2 : opts.sessions,
  groupSize: opts.groupSize,
  sandboxEvery: Math.round(opts.sandboxEvery),
  killAt: opts.kill ? opts.killAt : undefined,
  journalDir: opts.journalDir,
  sampleSeconds: quick && !set('sampleSeconds') ? 2 : opts.sampleSeconds,
  drainTimeoutMs: opts.drainTimeout * 1000,
  stopGraceMs: 30_000,
  verbose: true,
};

const result = await runSoak(options);
const { text } = renderSoak(result);
process.stdout.write(text);
mkdirSync(dirname(opts.output), { recursive: true });
writeFileSync(opts.output, `${JSON.stringify(result, null, 2)}\n`);
process.stderr.write(`results: ${opts.output}\n`);
process.exitCode = result.problems.length > 0 ? 1 : 0;
