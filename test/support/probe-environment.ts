/**
 * TEST DOUBLES for pipeline tests (from the 2026-12-02 pipeline review): a "probe" environment whose every stage does
 * what the instance says (ok, throw, its own timeout or abort, hang honouring the signal, hang ignoring it, wait for a
 * named gate), a counting sandbox driver (NullSandboxes), and a real server on 127.0.0.1:0 with the fake vLLM engine.
 */
import { z } from 'zod';
import { defaultRegistry } from '../../src/environments/registry.js';
import type { Environment, StageTimeouts } from '../../src/environments/types.js';
import { RolloutError } from '../../src/errors.js';
import { defineTool } from '../../src/tools/define-tool.js';
import { NullSandbox } from '../../src/testing/null-sandbox.js';
import type { Sandbox, SandboxDriver, SandboxSpec } from '../../src/sandboxes/types.js';
import { hermesToolCall, latestToolResponse, type FakePolicy } from '../../src/testing/scripted-policy.js';
import { startServerHarness, type ServerHarness, type ServerHarnessOptions } from './server-harness.js';
import type { TaskInput } from '../../src/client/rollout-client.js';

export type Behaviour = 'ok' | 'throw' | 'throw-own-timeout' | 'throw-own-abort' | 'hang' | 'stuck' | `gate:${string}` | `second-gate:${string}`;

export interface ProbeInstance {
  key: string;
  init?: Behaviour;
  eval?: Behaviour;
  /** 'tool:<gate>' makes the policy call the `wait` tool, which waits for that gate (honouring the signal). */
  run?: 'answer' | `tool:${string}` | `odd:${string}`;
}

export interface ProbeEvent {
  key: string;
  stage: 'init' | 'eval' | 'tool';
  what: 'enter' | 'leave' | 'aborted';
}

/** Shared state the test and the in-process server see. */
export class ProbeState {
  readonly events: ProbeEvent[] = [];
  private readonly gates = new Map<string, { promise: Promise<void>; open: () => void }>();
  /** Signals handed to stage functions, to check they all end aborted (nothing left listening to a live one). */
  readonly signals: AbortSignal[] = [];

  gate(name: string): { promise: Promise<void>; open: () => void } {
    let g = this.gates.get(name);
    if (!g) {
      let open!: () => void;
      const promise = new Promise<void>((resolve) => (open = resolve));
      g = { promise, open };
      this.gates.set(name, g);
    }
    return g;
  }

  open(name: string): void {
    this.gate(name).open();
  }

  count(key: string, stage: ProbeEvent['stage'], what: ProbeEvent['what']): number {
    return this.events.filter((e) => e.key === key && e.stage === stage && e.what === what).length;
  }

  async behave(key: string, stage: 'init' | 'eval', behaviour: Behaviour | undefined, signal: AbortSignal): Promise<void> {
    this.signals.push(signal);
    this.events.push({ key, stage, what: 'enter' });
    signal.addEventListener('abort', () => this.events.push({ key, stage, what: 'aborted' }), { once: true });
    let b = behaviour ?? 'ok';
    // second-gate:<g>: the first call passes, later ones wait at gate g.
    if (b.startsWith('second-gate:')) b = this.count(key, stage, 'enter') > 1 ? `gate:${b.slice('second-gate:'.length)}` : 'ok';
    try {
      await this.act(b as Behaviour, signal, `${key} ${stage}`);
    } finally {
      this.events.push({ key, stage, what: 'leave' });
    }
  }

  async act(behaviour: Behaviour, signal: AbortSignal, what: string): Promise<void> {
    if (behaviour === 'ok') return;
    if (behaviour === 'throw') throw new Error(`probe: ${what} threw`);
    // What an environment's own deadline on an outside call throws (fetch with AbortSignal.timeout: a grader service
    // that does not answer), and its own AbortController's abort — neither is the sample's signal.
    if (behaviour === 'throw-own-timeout') await fetchWithOwnDeadline();
    if (behaviour === 'throw-own-abort') {
      const own = new AbortController();
      own.abort();
      own.signal.throwIfAborted();
    }
    if (behaviour === 'stuck') return new Promise<void>(() => undefined);
    const wait = behaviour === 'hang' ? new Promise<void>(() => undefined) : this.gate(behaviour.slice('gate:'.length)).promise;
    await new Promise<void>((resolve, reject) => {
      if (signal.aborted) return reject(signal.reason);
      const onAbort = (): void => reject(signal.reason);
      signal.addEventListener('abort', onAbort, { once: true });
      void wait.then(() => {
        signal.removeEventListener('abort', onAbort);
        resolve();
      });
    });
  }
}

export function probeEnvironment(state: ProbeState, options: { stageTimeouts?: StageTimeouts } = {}): Environment<ProbeInstance> {
  const waitTool = defineTool({
    name: 'wait',
    description: 'Waits for a gate.',
    args: z.object({ gate: z.string() }),
    run: async ({ gate }, context) => {
      state.events.push({ key: gate, stage: 'tool', what: 'enter' });
      await state.act(`gate:${gate}`, context.signal ?? new AbortController().signal, `tool ${gate}`);
      state.events.push({ key: gate, stage: 'tool', what: 'leave' });
      return { output: `gate ${gate} opened`, outcome: 'ok' };
    },
  });
  return {
    name: 'probe',
    description: 'review probe',
    instanceSchema: { type: 'object' },
    toolNames: ['wait'],
    ...(options.stageTimeouts && { stageTimeouts: options.stageTimeouts }),
    validate: (x) => {
      const key = (x as { key?: unknown } | null)?.key;
      if (typeof key !== 'string' || !key) throw RolloutError.invalid('instance.key', 'required');
      return x as ProbeInstance;
    },
    init: async ({ instance, signal }) => {
      await state.behave(instance.key, 'init', instance.init, signal);
      return { messages: [{ role: 'user', content: `probe key=${instance.key} run=${instance.run ?? 'answer'}` }] };
    },
    tools: () => [waitTool],
    evaluate: async ({ instance, signal }) => {
      await state.behave(instance.key, 'eval', instance.eval, signal);
      return { reward: 1, details: { ok: 1 }, report: {} };
    },
  };
}

/** Calls `wait` once when the prompt says run=tool:<gate>, then answers. */
export const probePolicy: FakePolicy = (prompt, ctx) => {
  const m = /run=tool:([\w-]+)/.exec(prompt);
  if (m && latestToolResponse(prompt) === undefined) return hermesToolCall('wait', { gate: m[1]! });
  // run=odd:<gate>: samples with an odd index (seeded tasks: turn-0 seed = seed + 1000 × index) wait at the gate.
  const odd = /run=odd:([\w-]+)/.exec(prompt);
  if (odd && latestToolResponse(prompt) === undefined && Math.floor(ctx.seed / 1000) % 2 === 1) return hermesToolCall('wait', { gate: odd[1]! });
  return 'All done.';
};

/** A sandbox driver handing out NullSandboxes, counting starts and stops. */
export class CountingDriver implements SandboxDriver {
  readonly name = 'counting';
  started = 0;
  stopped = 0;
  /** How long each sandbox's stop takes (a real one kills a PID namespace and removes cgroups). */
  stopDelayMs = 0;
  get live(): number {
    return this.started - this.stopped;
  }
  async start(spec: SandboxSpec, signal?: AbortSignal): Promise<Sandbox> {
    if (signal?.aborted) throw RolloutError.from(signal.reason, 'cancelled');
    this.started++;
    const sandbox = new NullSandbox(`c-${this.started}`, spec, () => this.stopped++);
    const stop = sandbox.stop.bind(sandbox);
    sandbox.stop = async () => {
      if (this.stopDelayMs > 0) await new Promise((r) => setTimeout(r, this.stopDelayMs));
      await stop();
    };
    return sandbox;
  }
}

export interface ProbeHarness extends ServerHarness {
  state: ProbeState;
  driver: CountingDriver;
}

export async function startProbe(options: ServerHarnessOptions & { stageTimeouts?: StageTimeouts } = {}): Promise<ProbeHarness> {
  const state = new ProbeState();
  const driver = new CountingDriver();
  const { stageTimeouts, ...rest } = options;
  const h = await startServerHarness({
    sandboxes: driver,
    registry: defaultRegistry().register(probeEnvironment(state, stageTimeouts ? { stageTimeouts } : {})),
    ...rest,
    engine: { policy: probePolicy, ...rest.engine },
  });
  return Object.assign(h, { state, driver });
}

export function probeTask(taskId: string, instance: Omit<ProbeInstance, 'key'> & { key?: string }, extra: Partial<TaskInput> = {}): TaskInput {
  return {
    taskId,
    environment: 'probe',
    numSamples: 1,
    instance: { key: taskId, ...instance } as Record<string, unknown>,
    sampling: { maxTokensPerTurn: 64, maxTotalTokens: 2048, stop: [] },
    ...extra,
  };
}

/** A call to a grader service that does not answer within the environment's own 50 ms deadline. */
async function fetchWithOwnDeadline(): Promise<void> {
  const { createServer } = await import('node:net');
  const silent = createServer(() => undefined);
  await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
  const { port } = silent.address() as { port: number };
  try {
    await fetch(`http://127.0.0.1:${port}/grade`, { signal: AbortSignal.timeout(50) });
  } finally {
    silent.close();
    (silent as unknown as { closeAllConnections?: () => void }).closeAllConnections?.();
  }
}
