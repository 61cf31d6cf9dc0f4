/**
 * bench/sandbox: what one agent action and one sandbox cost, measured side by side in one run.
 *
 *   npx tsx bench/sandbox.ts [--actions 300] [--starts 30] [--sandboxes 64] [--seconds 5] [--image PATH]
 *                            [--output bench/results/sandbox.json]
 *
 * Per-action latency of a trivial command (`true`) four ways: through the sandbox's persistent shell, as an exec
 * into the long-lived sandbox (nsenter), as a fresh bubblewrap process per command (the old driver's way), and
 * plain `bash -c true` on the host (the floor). Sandbox start (and stop) latency from the .sif image, from the
 * same image unpacked into a directory, and from the host layout. Actions/s with 64 sandboxes running shell
 * commands at once. Prints figures; judges nothing (exit 1 only when a command failed or a sandbox leaked).
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { cpus, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { Command } from 'commander';
import { BubblewrapDriver } from '../src/sandboxes/bwrap.js';
import { defaultImagePath } from '../src/sandboxes/images/image-recipe.js';
import { readSifFile } from '../src/sandboxes/images/sif.js';
import type { Sandbox, SandboxSpec } from '../src/sandboxes/types.js';
import { percentile } from './drive.js';
import { note, startProgress } from './progress.js';

const opts = new Command()
  .option('--actions <n>', 'sequential actions per way', (v) => Number(v), 300)
  .option('--starts <n>', 'sandbox starts per root kind', (v) => Number(v), 30)
  .option('--sandboxes <n>', 'concurrent sandboxes in the throughput pass', (v) => Number(v), 64)
  .option('--seconds <n>', 'length of the throughput pass', (v) => Number(v), 5)
  .option('--image <path>', 'the .sif image (default: the one scripts/setup.sh built)')
  .option('--output <file>', 'figures as JSON', 'bench/results/sandbox.json')
  .parse()
  .opts<{ actions: number; starts: number; sandboxes: number; seconds: number; image?: string; output: string }>();

const image = opts.image ?? defaultImagePath();
if (!existsSync(image)) {
  note(`no image at ${image}: run scripts/setup.sh (or pass --image)`);
  process.exit(1);
}

interface Latency {
  p50: number;
  p90: number;
  p99: number;
  n: number;
}
const stats = (ms: number[]): Latency => ({ p50: percentile(ms, 50), p90: percentile(ms, 90), p99: percentile(ms, 99), n: ms.length });
const problems: string[] = [];

function spec(root: string | undefined): SandboxSpec {
  return {
    image: root,
    network: false,
    mounts: [],
    env: {},
    workdir: '/work',
    limits: { memoryMb: 256, maxProcesses: 64, diskMb: 64, wallClockMs: 600_000, commandTimeoutMs: 30_000, outputLimitBytes: 16_384, maxFileMb: 64 },
  };
}

/** Runs `argv` on the host and waits for it; rejects on a non-zero exit. */
function run(argv: readonly string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(argv[0]!, argv.slice(1), { stdio: 'ignore' });
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`${argv[0]} exited ${code}`))));
  });
}

async function timeEach(label: string, n: number, action: () => Promise<unknown>): Promise<Latency> {
  const progress = startProgress(label, n);
  const ms: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await action();
    ms.push(performance.now() - t0);
    progress.update(i + 1);
  }
  progress.stop();
  return stats(ms);
}

/** The old driver's way: a whole bubblewrap sandbox per command, over the host's /usr. */
const freshBwrap = ['bwrap', '--ro-bind', '/usr', '/usr', '--symlink', 'usr/bin', '/bin', '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64', '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp', '--unshare-all', '--die-with-parent', '--new-session', '--', '/bin/true'];

async function main(): Promise<void> {
  const driver = new BubblewrapDriver();
  const workdir = await mkdtemp(join(tmpdir(), 'rollout-bench-sandbox-'));
  const figures: Record<string, unknown> = { machine: { cpus: cpus().length, model: cpus()[0]?.model ?? '' }, image, capabilities: driver.capabilities };
  try {
    // 1. One action, four ways.
    const sandbox = await driver.start(spec(image));
    const shell = sandbox.shell();
    for (let i = 0; i < 20; i++) await shell.run('true'); // warm: the first commands start the shell
    const actions = {
      shell: await timeEach('persistent shell: true', opts.actions, async () => {
        const r = await shell.run('true');
        if (r.exitCode !== 0) problems.push(`shell: exit ${r.exitCode}`);
      }),
      exec: await timeEach('exec into the sandbox: true', opts.actions, async () => {
        const r = await sandbox.exec(['true']);
        if (r.exitCode !== 0) problems.push(`exec: exit ${r.exitCode}`);
      }),
      freshBwrap: await timeEach('fresh bwrap per command: true', opts.actions, () => run(freshBwrap)),
      hostFloor: await timeEach('host bash -c true (floor)', opts.actions, () => run(['bash', '-c', 'true'])),
    };
    await sandbox.stop();
    figures.actions = actions;

    // 2. Sandbox start and stop, per kind of root.
    const unpacked = join(workdir, 'rootfs');
    const part = await readSifFile(image);
    await mkdir(dirname(unpacked), { recursive: true });
    await run(['unsquashfs', '-q', '-n', '-o', String(part.offset), '-d', unpacked, image]);
    const starts: Record<string, { start: Latency; stop: Latency }> = {};
    for (const [kind, root] of [['sif', image], ['directory', unpacked], ['host layout', undefined]] as const) {
      const start: number[] = [];
      const stop: number[] = [];
      const progress = startProgress(`start + stop (${kind})`, opts.starts);
      for (let i = 0; i < opts.starts; i++) {
        const t0 = performance.now();
        const s = await driver.start(spec(root));
        const t1 = performance.now();
        await s.stop();
        start.push(t1 - t0);
        stop.push(performance.now() - t1);
        progress.update(i + 1);
      }
      progress.stop();
      starts[kind] = { start: stats(start), stop: stats(stop) };
    }
    figures.starts = starts;

    // 3. Throughput: N sandboxes, each running `true` through its shell as fast as it can.
    const many: Sandbox[] = [];
    const startMany = startProgress(`start ${opts.sandboxes} sandboxes`, opts.sandboxes);
    const tMany = performance.now();
    for (const s of await Promise.all(Array.from({ length: opts.sandboxes }, () => driver.start(spec(image))))) {
      many.push(s);
      startMany.update(many.length);
    }
    startMany.stop();
    const concurrentStartMs = performance.now() - tMany;
    await Promise.all(many.map((s) => s.shell().run('true')));
    const latencies: number[] = [];
    const deadline = performance.now() + opts.seconds * 1000;
    note(`throughput: ${opts.sandboxes} sandboxes × persistent shell for ${opts.seconds} s`);
    await Promise.all(
      many.map(async (s) => {
        while (performance.now() < deadline) {
          const t0 = performance.now();
          const r = await s.shell().run('true');
          latencies.push(performance.now() - t0);
          if (r.exitCode !== 0) problems.push(`throughput: exit ${r.exitCode}`);
        }
      }),
    );
    await Promise.all(many.map((s) => s.stop()));
    figures.throughput = { sandboxes: opts.sandboxes, seconds: opts.seconds, actions: latencies.length, actionsPerSecond: latencies.length / opts.seconds, latency: stats(latencies), concurrentStartMs };
  } finally {
    await driver.close?.();
    await rm(workdir, { recursive: true, force: true });
  }

  const a = figures.actions as Record<string, Latency>;
  const s = figures.starts as Record<string, { start: Latency; stop: Latency }>;
  const t = figures.throughput as { actionsPerSecond: number; latency: Latency; concurrentStartMs: number };
  const f = (x: number): string => x.toFixed(2);
  const rows: string[][] = [
    ['per action (`true`)', 'p50 ms', 'p90 ms', 'p99 ms'],
    ['persistent shell (long-lived sandbox)', f(a.shell!.p50), f(a.shell!.p90), f(a.shell!.p99)],
    ['exec into the long-lived sandbox (nsenter)', f(a.exec!.p50), f(a.exec!.p90), f(a.exec!.p99)],
    ['fresh bubblewrap per command', f(a.freshBwrap!.p50), f(a.freshBwrap!.p90), f(a.freshBwrap!.p99)],
    ['host `bash -c true` (floor)', f(a.hostFloor!.p50), f(a.hostFloor!.p90), f(a.hostFloor!.p99)],
    ['', '', '', ''],
    ['sandbox start (stop p50)', 'p50 ms', 'p90 ms', 'stop ms'],
    ...Object.entries(s).map(([kind, v]) => [`from ${kind}`, f(v.start.p50), f(v.start.p90), f(v.stop.p50)]),
    ['', '', '', ''],
    [`${opts.sandboxes} sandboxes at once, shell actions`, `${t.actionsPerSecond.toFixed(0)}/s`, `p50 ${f(t.latency.p50)}`, `p99 ${f(t.latency.p99)}`],
    [`start of ${opts.sandboxes} at once (wall)`, `${t.concurrentStartMs.toFixed(0)} ms`, '', ''],
  ];
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  console.log(rows.map((r) => r.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ')).join('\n'));
  console.log(`\npersistent shell p50 − floor p50 = ${f(a.shell!.p50 - a.hostFloor!.p50)} ms (target: within 2 ms of the floor)`);
  figures.shellMinusFloorMs = a.shell!.p50 - a.hostFloor!.p50;
  await mkdir(dirname(opts.output), { recursive: true });
  await writeFile(opts.output, `${JSON.stringify({ ...figures, problems }, null, 2)}\n`);
  if (problems.length > 0) {
    console.log(`\nproblems:\n${[...new Set(problems)].map((p) => `- ${p}`).join('\n')}`);
    process.exitCode = 1;
  }
}

await main();
