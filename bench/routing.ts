/**
 * Routing benchmark: the production routing policy (BackendPool's capacity-weighted heap and deepest-first slot
 * queues), the same pool with FIFO slot queues, and four baselines on simulated heterogeneous engines under a long-tailed multi-turn workload, in virtual time. Prints figures,
 * never judges them; exits 1 only when the simulator's own invariants break (a trajectory that did not finish,
 * an engine over capacity, a cache hit off the sticky engine).
 *
 *   npx tsx bench/routing.ts [--trajectories 8000] [--concurrency 400] [--seed 1] [--output bench/results/routing.json]
 *
 * See bench/README.md (routing) for the model and what each figure means.
 */
import { Command } from 'commander';
import { positiveInt } from './options.js';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { defaultEngines } from './routing/engines.js';
import { stepEnd, type StepEnd } from './routing/critical-path.js';
import { invariantProblems } from './routing/invariants.js';
import { POLICIES } from './routing/routers.js';
import { simulate, type PolicyReport } from './routing/simulate.js';
import { DEFAULT_WORKLOAD, makeWorkload } from './routing/workload.js';


const options = new Command()
  .name('routing')
  .description('Routing policies on simulated heterogeneous engines (virtual time, deterministic).')
  .option('--trajectories <n>', 'trajectories in the simulated RL step', positiveInt, 8000)
  .option('--concurrency <n>', 'trajectories in flight at once (run-stage concurrency)', positiveInt, 400)
  .option('--seed <n>', 'workload seed', positiveInt, 1)
  .option('--output <path>', 'JSON results file', fileURLToPath(new URL('./results/routing.json', import.meta.url)))
  .parse()
  .opts<{ trajectories: number; concurrency: number; seed: number; output: string }>();

const engines = defaultEngines();
const workload = makeWorkload({ trajectories: options.trajectories, seed: options.seed, ...DEFAULT_WORKLOAD });
const reports: PolicyReport[] = [];
const ends = new Map<string, StepEnd>();
const problems: string[] = [];
for (const policy of POLICIES) {
  const started = performance.now();
  const report = await simulate(policy, { engines, workload, concurrency: options.concurrency });
  process.stderr.write(`${policy}: simulated in ${((performance.now() - started) / 1000).toFixed(1)} s\n`);
  reports.push(report);
  ends.set(policy, stepEnd(report, workload, engines));
  problems.push(...invariantProblems(report, workload, engines).map((p) => `${policy}: ${p}`));
}

const pct = (x: number): string => `${(100 * x).toFixed(1)}%`;
const sec = (x: number): string => `${x.toFixed(0)} s`;
const rows = [
  ['policy', 'utilisation', 'per engine', 'saturated', 'makespan', 'p50', 'p90', 'cache hits', 'prefill', 'moves'],
  ...reports.map((r) => [
    r.policy, pct(r.utilisation), r.engines.map((e) => pct(e.utilisation)).join(' '), pct(r.utilisationSaturated), sec(r.makespan), sec(r.latencyP50), sec(r.latencyP90),
    pct(r.cacheHitRate), pct(r.prefillShare), String(r.moves),
  ]),
];
const widths = rows[0]!.map((_, i) => Math.max(...rows.map((row) => row[i]!.length)));
const turns = workload.reduce((s, t) => s + t.outputTokens.length, 0);
console.log(`${workload.length} trajectories (${turns} turns, seed ${options.seed}), ${options.concurrency} in flight; engines ${engines
  .map((e) => `${e.id} (${e.maxSequences} seqs)`).join(', ')}; virtual seconds`);
console.log(rows.map((row) => row.map((c, i) => (i === 0 || i === 2 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ')).join('\n'));
const best = (f: (r: PolicyReport) => number): string => [...reports].sort((a, b) => f(a) - f(b))[0]!.policy;
console.log(`best makespan: ${best((r) => r.makespan)}; best p90: ${best((r) => r.latencyP90)}; highest utilisation: ${best((r) => -r.utilisation)}`);
const ours = ends.get('capacity-heap')!;
console.log(
  `how the step ended (capacity-heap): trajectory #${ours.trajectory} (${ours.turns} turns) started at ${sec(ours.start)} (${pct(ours.startShare)} of the makespan) and ran ${sec(ours.ran)}; ` +
    `alone on the fastest idle engine it needs ${sec(ours.alone)}. From this run's starts no routing ends the step before ${sec(ours.bound)}, ` +
    `where this run's busy time would be ${pct(ours.utilisationAtBound)} utilisation`,
);

mkdirSync(dirname(options.output), { recursive: true });
writeFileSync(options.output, `${JSON.stringify({
  options, engines, workload: DEFAULT_WORKLOAD, turns,
  policies: reports.map(({ trajectories: _omitted, ...r }) => ({ ...r, stepEnd: ends.get(r.policy) })),
  problems,
}, null, 2)}\n`);
console.error(`results written to ${options.output}`);
for (const p of problems) console.error(`PROBLEM ${p}`);
process.exitCode = problems.length > 0 ? 1 : 0;
