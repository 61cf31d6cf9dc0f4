import { SlotQueue } from '../../src/backends/backend-state.js';
import { BackendPool } from '../../src/backends/pool.js';
import type { GenerateRequest } from '../../src/backends/types.js';
import { fnv1a } from './rng.js';
import type { SimEngine } from './sim-engine.js';

/** A trajectory's route to the engines, opened when it starts and closed when it ends. */
export interface Route {
  /** Runs one turn; resolves with the id of the engine that served it. */
  generate(request: GenerateRequest): Promise<string>;
  close(): void;
}

/** A routing policy under comparison. */
export interface Router {
  readonly name: string;
  open(trajectory: number): Promise<Route>;
  close(): void;
}

/** The policies bench/routing compares, by name. */
export const POLICIES = ['capacity-heap', 'capacity-heap-fifo', 'cumulative-count', 'consistent-hash', 'least-requests', 'round-robin'] as const;
export type PolicyName = (typeof POLICIES)[number];

/**
 * Our policy is the production BackendPool itself (its LoadHeap, leases and slot queues), each simulated engine
 * added with its max sequences as max concurrency: what the benchmark measures is what the server runs.
 * `capacity-heap` is the pool as configured by default (queued requests served deepest trajectory first);
 * `capacity-heap-fifo` the same pool with `queueOrder: 'fifo'`, to show what the queue order does on its own.
 */
class PoolRouter implements Router {
  readonly #pool: BackendPool;

  constructor(readonly name: PolicyName, engines: readonly SimEngine[], queueOrder: 'turns' | 'fifo') {
    this.#pool = new BackendPool({ acquireTimeoutMs: Number.POSITIVE_INFINITY, queueOrder });
    for (const e of engines) this.#pool.add(e, { id: e.id, maxConcurrency: e.model.maxSequences, model: 'sim', maxModelLen: 1 << 30 });
  }

  async open(trajectory: number): Promise<Route> {
    const lease = await this.#pool.acquire(`t${trajectory}`);
    return { generate: async (request) => (await lease.generate(request)).backendId, close: () => lease.release() };
  }

  close(): void {
    this.#pool.close();
  }
}

interface Gate {
  readonly engine: SimEngine;
  /** The production slot queue: at most max-sequences requests at the engine, the rest FIFO, as in the pool. */
  readonly slots: SlotQueue;
  inflight: number;
  assigned: number;
}

/**
 * The baselines: a choice function over the same engines, behind the same per-engine gate the pool uses, with the
 * pool's default queue order (a request's priority is the turns its trajectory has run), so engine admission is
 * identical and only the choice differs. `sticky` policies choose once per trajectory, the others once per turn.
 */
class ChoiceRouter implements Router {
  readonly #gates: Gate[];

  constructor(
    readonly name: PolicyName,
    engines: readonly SimEngine[],
    private readonly sticky: boolean,
    private readonly choose: (gates: readonly Gate[], trajectory: number) => Gate,
  ) {
    this.#gates = engines.map((engine) => ({ engine, slots: new SlotQueue(engine.model.maxSequences), inflight: 0, assigned: 0 }));
  }

  async open(trajectory: number): Promise<Route> {
    let home = this.sticky ? this.choose(this.#gates, trajectory) : undefined;
    if (home !== undefined) home.assigned++;
    let turn = 0;
    return {
      generate: async (request) => {
        const gate = home ?? this.choose(this.#gates, trajectory);
        gate.inflight++;
        await gate.slots.acquire(request.signal, turn++);
        try {
          await gate.engine.generate(request);
          return gate.engine.id;
        } finally {
          gate.slots.release();
          gate.inflight--;
        }
      },
      close: () => (home = undefined),
    };
  }

  close(): void {}
}

const byId = (a: Gate, b: Gate): number => (a.engine.id < b.engine.id ? -1 : 1);
const least = (gates: readonly Gate[], key: (g: Gate) => number): Gate =>
  [...gates].sort((a, b) => key(a) - key(b) || byId(a, b))[0]!;

/** A hash ring with the same number of virtual nodes per engine (capacity-blind, as usually deployed). */
function hashRing(engines: readonly SimEngine[], vnodes = 64): (gates: readonly Gate[], trajectory: number) => Gate {
  const ring = engines.flatMap((e, i) => Array.from({ length: vnodes }, (_, v) => ({ at: fnv1a(`${e.id}#${v}`), i }))).sort((a, b) => a.at - b.at);
  return (gates, trajectory) => {
    const h = fnv1a(`t${trajectory}`);
    const node = ring.find((n) => n.at >= h) ?? ring[0]!;
    return gates[node.i]!;
  };
}

export function makeRouter(name: PolicyName, engines: readonly SimEngine[]): Router {
  switch (name) {
    case 'capacity-heap':
      return new PoolRouter(name, engines, 'turns');
    case 'capacity-heap-fifo':
      return new PoolRouter(name, engines, 'fifo');
    case 'cumulative-count': // the seed system: sticky, fewest trajectories ever assigned
      return new ChoiceRouter(name, engines, true, (gates) => least(gates, (g) => g.assigned));
    case 'consistent-hash':
      return new ChoiceRouter(name, engines, true, hashRing(engines));
    case 'least-requests': // not sticky: each turn to the engine with the fewest requests in flight
      return new ChoiceRouter(name, engines, false, (gates) => least(gates, (g) => g.inflight));
    case 'round-robin': {
      let next = 0;
      return new ChoiceRouter(name, engines, false, (gates) => gates[next++ % gates.length]!);
    }
  }
}
