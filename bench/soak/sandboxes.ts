import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { Sandbox, SandboxDriver, SandboxSpec } from '../../src/sandboxes/types.js';
import type { Logger } from '../../src/observability/logger.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { NULL_SANDBOX_ENV } from './names.js';

/**
 * TEST DOUBLE seam for bench/soak.ts: bubblewrap for every sandbox except those whose spec carries
 * `ROLLOUT_SOAK_SANDBOX=null`, which get a {@link NullSandboxDriver} sandbox (no process). Why: 2,000 concurrent
 * trajectories do not fit on 2 cores if each holds a bubblewrap process tree, yet the soak must also prove that
 * real sandboxes (cgroups, processes) are released on every path, including a kill -9 of the server. `reap` and
 * `close` are bubblewrap's, so a restarted server removes what its killed predecessor left.
 */
export class SoakSandboxDriver implements SandboxDriver {
  readonly name = 'soak(bwrap+null)';
  readonly bwrap: BubblewrapDriver;
  readonly nulls = new NullSandboxDriver();

  constructor(logger: Logger) {
    this.bwrap = new BubblewrapDriver({ logger });
  }

  start(spec: SandboxSpec, signal?: AbortSignal): Promise<Sandbox> {
    return spec.env[NULL_SANDBOX_ENV] === 'null' ? this.nulls.start(spec, signal) : this.bwrap.start(spec, signal);
  }

  reap(): Promise<{ removed: number }> {
    return this.bwrap.reap();
  }

  close(): Promise<void> {
    return this.bwrap.close();
  }
}
