/**
 * `rollout serve` (src/cli/serve.ts `runServe`, through its `inject` seam) whose sandboxes never finish stopping: a
 * test double of a stuck sandbox stop (a hung `apptainer instance stop`, an unkillable mount). The sandboxes are real
 * bubblewrap ones — only `stop()` is replaced by a promise that never settles, and the real stop is never called —
 * so a drain hangs for good once work in flight is cancelled, with real sandbox processes running.
 *
 * Usage: `node --import tsx test/cli/review-s38-stuck-stop-serve.ts [--fake-latency-ms N]`; prints the
 * "listening on" line as `rollout serve` does.
 */
import { parseArgs } from 'node:util';
import { runServe } from '../../src/cli/serve.js';
import { createLogger } from '../../src/observability/logger.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { Sandbox, SandboxDriver, SandboxSpec } from '../../src/sandboxes/types.js';

const { values } = parseArgs({ options: { 'fake-latency-ms': { type: 'string', default: '400' } } });

/** A double around the real bubblewrap driver: its sandboxes' `stop()` never returns. */
class StuckStopDriver implements SandboxDriver {
  readonly name = 'bwrap-stuck-stop';
  constructor(private readonly real: BubblewrapDriver) {}
  async start(spec: SandboxSpec, signal?: AbortSignal): Promise<Sandbox> {
    const sandbox = await this.real.start(spec, signal);
    // Methods bound to the real sandbox (its private fields are not the proxy's).
    return new Proxy(sandbox, {
      get: (target, key) => {
        // A real stuck stop waits on something (a child process, a socket) that keeps the event loop alive: a ref'd
        // timer stands for it.
        if (key === 'stop') return () => new Promise<void>(() => setInterval(() => undefined, 1 << 30));
        const value: unknown = Reflect.get(target, key, target);
        return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
      },
    });
  }
  reap(): Promise<{ removed: number }> {
    return this.real.reap();
  }
  close(): Promise<void> {
    return this.real.close();
  }
}

const sandboxes = new StuckStopDriver(new BubblewrapDriver({ logger: createLogger().child({ component: 'sandbox' }) }));
await runServe({ file: {}, backend: [], port: 0, fakeEngine: true, fakeLatencyMs: Number(values['fake-latency-ms']) }, { sandboxes });
