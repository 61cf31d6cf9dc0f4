import { RolloutError } from '../errors.js';
import type { DirEntry, ExecResult, PersistentShell, Sandbox, SandboxDriver, SandboxProcess, SandboxSpec } from '../sandboxes/types.js';

/**
 * TEST DOUBLE: a sandbox that runs nothing. Files live in a Map (created on first write, so an unused sandbox
 * costs a few dozen bytes); `exec` always fails with `sandbox_error`, so an environment or tool that really needs
 * a process fails loudly instead of being scored on an empty output. `stop` is idempotent and later calls fail
 * like a stopped real sandbox.
 *
 * Why: benchmarks of the orchestration (pipeline, routing, token ledger, gRPC) must not measure process spawning,
 * and environments whose tools compute in-process (see `calc-environment.ts`) still get the sandbox the pipeline
 * always hands out. Never a server default: it is only used when passed explicitly as
 * `startRolloutServer(config, { sandboxes: new NullSandboxDriver() })`.
 */
export class NullSandbox implements Sandbox {
  readonly workdir: string;
  #files: Map<string, string> | undefined;
  #stopped = false;

  /** `onStop` runs once, on the first `stop()`. */
  constructor(
    readonly id: string,
    readonly spec: SandboxSpec,
    private readonly onStop: () => void = () => undefined,
  ) {
    this.workdir = spec.workdir;
  }

  get stopped(): boolean {
    return this.#stopped;
  }

  async exec(argv: readonly string[]): Promise<ExecResult> {
    this.#check();
    throw new RolloutError('sandbox_error', `NullSandbox ${this.id} runs no processes (asked to run ${argv[0] ?? '(nothing)'})`);
  }

  spawn(argv: readonly string[]): SandboxProcess {
    this.#check();
    throw new RolloutError('sandbox_error', `NullSandbox ${this.id} runs no processes (asked to spawn ${argv[0] ?? '(nothing)'})`);
  }

  shell(): PersistentShell {
    this.#check();
    throw new RolloutError('sandbox_error', `NullSandbox ${this.id} has no shell`);
  }

  async listDir(path: string): Promise<DirEntry[]> {
    this.#check();
    const prefix = path.endsWith('/') ? path : `${path}/`;
    const names = new Set<string>();
    for (const file of this.#files?.keys() ?? []) if (file.startsWith(prefix)) names.add(file.slice(prefix.length).split('/')[0]!);
    return [...names].sort().map((name) => {
      const content = this.#files?.get(`${prefix}${name}`);
      return content === undefined ? { name, type: 'dir' as const, size: 0 } : { name, type: 'file' as const, size: Buffer.byteLength(content) };
    });
  }

  async writeFile(path: string, content: string): Promise<void> {
    this.#check();
    (this.#files ??= new Map()).set(path, content);
  }

  async readFile(path: string): Promise<string> {
    this.#check();
    const content = this.#files?.get(path);
    if (content === undefined) throw new RolloutError('sandbox_error', `NullSandbox ${this.id}: no file ${path}`);
    return content;
  }

  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    this.#files = undefined;
    this.onStop();
  }

  #check(): void {
    if (this.#stopped) throw new RolloutError('sandbox_error', `NullSandbox ${this.id} is stopped`);
  }
}

/**
 * TEST DOUBLE: a SandboxDriver handing out {@link NullSandbox}es. Counts what it did so a benchmark or test can
 * check that every sandbox was stopped (`live` returns to 0).
 *
 * @example
 * const sandboxes = new NullSandboxDriver();
 * const server = await startRolloutServer(config, { sandboxes, registry });
 * // ... run trajectories ...
 * assert(sandboxes.live === 0);
 */
export class NullSandboxDriver implements SandboxDriver {
  readonly name = 'null';
  #started = 0;
  #stopped = 0;

  /** Sandboxes started and not stopped yet. */
  get live(): number {
    return this.#started - this.#stopped;
  }

  get started(): number {
    return this.#started;
  }

  async start(spec: SandboxSpec, signal?: AbortSignal): Promise<Sandbox> {
    if (signal?.aborted) throw RolloutError.from(signal.reason, 'cancelled');
    return new NullSandbox(`null-${++this.#started}`, spec, () => this.#stopped++);
  }
}
