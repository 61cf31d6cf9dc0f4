import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

/**
 * A tiny request/response protocol over Node's IPC channel, so a benchmark can run the server and the engine in
 * their own processes (memory and CPU measured per process, not mixed with the client's) and still drive them.
 * An API is a record of async functions; the parent calls them by name and gets their results (structured clone).
 */
export type ChildApi = Record<string, (params: never) => unknown>;

interface RpcRequest {
  id: number;
  method: string;
  params: unknown;
}

type RpcResponse = { id: number; result: unknown } | { id: number; error: string } | { ready: unknown };

const REPO_ROOT = fileURLToPath(new URL('..', import.meta.url));

/**
 * Child side: answers calls with `api` once `ready` has resolved (its value goes to the parent as `info`). The
 * child exits when the parent goes away (IPC disconnect), so a crashed benchmark leaves no stray processes.
 */
export async function serveChild<Info>(ready: Promise<Info>, api: ChildApi): Promise<void> {
  const send = process.send?.bind(process);
  if (!send) throw new Error('this script is a benchmark child: start it through child-rpc spawnChild');
  process.on('disconnect', () => process.exit(0));
  const info = await ready;
  process.on('message', (message: RpcRequest) => {
    const fn = api[message.method] as ((params: unknown) => unknown) | undefined;
    Promise.resolve()
      .then(() => {
        if (!fn) throw new Error(`no method ${message.method}`);
        return fn(message.params);
      })
      .then(
        (result) => send({ id: message.id, result } satisfies RpcResponse),
        (err: unknown) => send({ id: message.id, error: err instanceof Error ? (err.stack ?? err.message) : String(err) } satisfies RpcResponse),
      );
  });
  send({ ready: info } satisfies RpcResponse);
}

/** Parent side of one child process. */
export class ChildHandle<Api extends ChildApi, Info> {
  #nextId = 0;
  readonly #pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  #exited: Promise<number | null>;

  private constructor(
    readonly name: string,
    private readonly child: ChildProcess,
    readonly info: Info,
  ) {
    this.#exited = new Promise((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) resolve(child.exitCode);
      else child.once('exit', (code) => resolve(code));
    });
    child.on('message', (message: RpcResponse) => {
      if ('ready' in message) return;
      const waiter = this.#pending.get(message.id);
      if (!waiter) return;
      this.#pending.delete(message.id);
      if ('error' in message) waiter.reject(new Error(`${name}: ${message.error}`));
      else waiter.resolve(message.result);
    });
    child.once('exit', (code, signal) => {
      for (const w of this.#pending.values()) w.reject(new Error(`${name} exited (code ${code}, signal ${signal})`));
      this.#pending.clear();
    });
  }

  /**
   * Forks `node --expose-gc --import tsx <script> ...args` from the repository root (so `tsx` resolves) and waits
   * for the child's ready message. stdout/stderr are inherited, so a child's crash is visible. With the
   * environment variable BENCH_CPU_PROF=<dir>, each child writes a V8 CPU profile there when it exits; with
   * BENCH_TRACE_GC=1 each prints V8's --trace-gc lines; BENCH_NODE_FLAGS adds node flags (e.g. V8 heap sizes).
   */
  static async spawn<Api extends ChildApi, Info>(name: string, script: URL, args: readonly string[], timeoutMs = 60_000, nodeFlags: readonly string[] = []): Promise<ChildHandle<Api, Info>> {
    const child = fork(fileURLToPath(script), [...args], {
      cwd: REPO_ROOT,
      execArgv: ['--expose-gc', ...nodeFlags, ...(process.env.BENCH_TRACE_GC ? ['--trace-gc'] : []), ...(process.env.BENCH_NODE_FLAGS?.split(' ').filter(Boolean) ?? []), '--import', 'tsx', ...(process.env.BENCH_CPU_PROF ? ['--cpu-prof', '--cpu-prof-dir', process.env.BENCH_CPU_PROF] : [])],
      serialization: 'advanced',
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const info = await new Promise<Info>((resolve, reject) => {
      const timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(new Error(`${name} did not start within ${timeoutMs} ms`));
      }, timeoutMs);
      const onMessage = (message: RpcResponse): void => {
        if (!('ready' in message)) return;
        clearTimeout(timer);
        child.off('message', onMessage);
        resolve(message.ready as Info);
      };
      child.on('message', onMessage);
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`${name} exited before it was ready (code ${code}, signal ${signal})`));
      });
    });
    return new ChildHandle<Api, Info>(name, child, info);
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  call<K extends keyof Api & string>(method: K, ...params: Parameters<Api[K]>): Promise<Awaited<ReturnType<Api[K]>>> {
    return this.#send(method, params[0]) as Promise<Awaited<ReturnType<Api[K]>>>;
  }

  #send(method: string, params: unknown): Promise<unknown> {
    if (!this.child.connected) return Promise.reject(new Error(`${this.name} is not running`));
    const id = this.#nextId++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      this.child.send({ id, method, params } satisfies RpcRequest);
    });
  }

  /** Asks the child to shut down through `shutdownMethod`, then kills this one process if it has not exited. */
  async stop(shutdownMethod?: keyof Api & string, graceMs = 5_000): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null && shutdownMethod && this.child.connected) {
      await this.#send(shutdownMethod, undefined).catch(() => undefined);
    }
    const timer = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    if (this.child.connected) this.child.disconnect();
    await this.#exited;
    clearTimeout(timer);
  }

  /** Kills the process at once (used when the benchmark itself fails). */
  kill(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
  }
}
