/**
 * The soak's server process: `rollout serve` itself (src/cli/serve.ts `runServe`: config file, flags, SIGTERM →
 * shutdown, the "listening on" line), with two benchmark doubles injected through its `inject` seam, because the CLI
 * has no way to name them (and must not):
 *
 * - environments `math` (the real one: python tool in bubblewrap; its sandboxes carry `ROLLOUT_SOAK_RUN=<run tag>`
 *   so the bench can find any of their processes left on the host) and `soak-calc` (the calc double,
 *   src/testing/calc-environment.ts, whose sandboxes are null: no process);
 * - {@link SoakSandboxDriver}: bubblewrap, or a NullSandbox for `soak-calc`.
 *
 * Usage (bench/soak.ts starts it): `node --import tsx bench/soak/server.ts --config FILE --run-tag TAG [--journal-dir DIR]`.
 * `--journal-dir` is handed to runServe as `journalDir` (the `rollout serve --journal-dir` option of the durable
 * journal); a runServe without that option ignores it, and the soak's accounting then shows what a restart loses.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { parseArgs } from 'node:util';
import { runServe, type ServeOptions } from '../../src/cli/serve.js';
import { EnvironmentRegistry } from '../../src/environments/registry.js';
import { createMathEnvironment } from '../../src/environments/math/math-environment.js';
import type { Environment } from '../../src/environments/types.js';
import { createLogger } from '../../src/observability/logger.js';
import { createCalcEnvironment } from '../../src/testing/calc-environment.js';
import { NULL_SANDBOX_ENV, RUN_TAG_ENV, SOAK_CALC_ENVIRONMENT } from './names.js';
import { SoakSandboxDriver } from './sandboxes.js';

function withSandboxEnv<I>(environment: Environment<I>, name: string, env: Record<string, string>): Environment<I> {
  return { ...environment, name, sandbox: (instance) => ({ ...environment.sandbox?.(instance), env: { ...environment.sandbox?.(instance).env, ...env } }) };
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { config: { type: 'string' }, 'run-tag': { type: 'string' }, 'journal-dir': { type: 'string' } } });
  if (!values.config || !values['run-tag']) throw new Error('usage: server.ts --config FILE --run-tag TAG [--journal-dir DIR]');
  const registry = new EnvironmentRegistry()
    .register(withSandboxEnv(createMathEnvironment(), 'math', { [RUN_TAG_ENV]: values['run-tag'] }))
    .register(withSandboxEnv(createCalcEnvironment(), SOAK_CALC_ENVIRONMENT, { [NULL_SANDBOX_ENV]: 'null' }));
  const sandboxes = new SoakSandboxDriver(createLogger().child({ component: 'soak-sandboxes' }));
  // A variable, not a literal: `journalDir` is an option of the journal's runServe, unknown to older ones.
  const opts: ServeOptions & { journalDir?: string } = {
    file: JSON.parse(readFileSync(values.config, 'utf8')) as Record<string, unknown>,
    backend: [],
    fakeLatencyMs: 0,
    ...(values['journal-dir'] !== undefined && { journalDir: values['journal-dir'] }),
  };
  // The bench holds our stdin: when it goes away (crashed, killed), stdin closes and we shut down as on SIGTERM,
  // so a failed soak leaves no server behind. Unref'd, so it never keeps this process alive by itself.
  process.stdin.once('close', () => process.kill(process.pid, 'SIGTERM'));
  process.stdin.on('data', () => undefined);
  (process.stdin as NodeJS.ReadStream & { unref?: () => void }).unref?.();
  // Returns after SIGTERM's shutdown; the process must then end by itself (the bench times it: a handle left open
  // — a timer, a socket, a child — keeps it alive, and that is a finding, so no process.exit here).
  // The V8 heap as the bench cannot see it from /proc (RSS also counts the journal's memory map and freed pages V8
  // keeps): written next to the config every 2 s, read by the bench's sampler. Unref'd like the stdin watch.
  // Every 10 s a full collection first (the bench starts this process with --expose-gc), so `heapUsed` is what is
  // live — a leak's slope, not the collector's sawtooth. It costs a pause of tens of ms every 10 s (bench only).
  const heapFile = join(dirname(values.config), `heap-${process.pid}.json`);
  const gc = (globalThis as { gc?: () => void }).gc;
  setInterval(() => {
    gc?.();
    const m = process.memoryUsage();
    writeFileSync(heapFile, JSON.stringify({ heapUsed: m.heapUsed, heapTotal: m.heapTotal, external: m.external, arrayBuffers: m.arrayBuffers, afterGc: gc !== undefined }));
  }, 10_000).unref();
  await runServe(opts, { registry, sandboxes });
}

void main().catch((err: unknown) => {
  console.error('soak server failed:', err);
  process.exit(1);
});
