import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { compareLoad, type LoadKey } from '../../src/backends/picker.js';
import { referenceOrder } from './reference-load-order.js';
import { BackendPool } from '../../src/backends/pool.js';
import type { BackendLease, LeaseResult } from '../../src/backends/lease.js';
import type { EngineServerInfo } from '../../src/backends/types.js';
import type { RolloutError } from '../../src/errors.js';
import { InMemoryEngineClient } from '../../src/testing/in-memory-engine.js';

/**
 * Random sequences of pool operations checked against a reference model after every step. The model keeps its
 * own membership, health and draining flags and its own record of where each lease lives (a lease may only
 * move when the model saw its backend removed or unhealthy); loads are derived from that record, and the
 * model's least-loaded choice (by the reference key below, not by the code under test) must be the pool's.
 */


type Op =
  | { kind: 'add'; healthy: boolean; maxConcurrency: number }
  | { kind: 'report'; pick: number; capacity: number }
  | { kind: 'remove'; pick: number; drain: boolean }
  | { kind: 'health'; pick: number; healthy: boolean }
  | { kind: 'acquire' }
  | { kind: 'release'; pick: number }
  | { kind: 'start'; pick: number }
  | { kind: 'finish'; pick: number };

/** maxConcurrency 0: not configured — the pool's default (2) until the engine reports its own (a `report` op). */
const addArb = fc.record({ kind: fc.constant('add' as const), healthy: fc.boolean(), maxConcurrency: fc.integer({ min: 0, max: 4 }) });
const DEFAULT_CAPACITY = 2;
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { arbitrary: addArb, weight: 2 },
  { arbitrary: fc.record({ kind: fc.constant('remove' as const), pick: fc.nat(), drain: fc.boolean() }), weight: 1 },
  { arbitrary: fc.record({ kind: fc.constant('health' as const), pick: fc.nat(), healthy: fc.boolean() }), weight: 2 },
  { arbitrary: fc.constant({ kind: 'acquire' as const }), weight: 4 },
  { arbitrary: fc.record({ kind: fc.constant('release' as const), pick: fc.nat() }), weight: 2 },
  { arbitrary: fc.record({ kind: fc.constant('start' as const), pick: fc.nat() }), weight: 3 },
  { arbitrary: fc.record({ kind: fc.constant('finish' as const), pick: fc.nat() }), weight: 3 },
  { arbitrary: fc.record({ kind: fc.constant('report' as const), pick: fc.nat(), capacity: fc.integer({ min: 1, max: 5 }) }), weight: 1 },
);

interface ModelBackend {
  id: string;
  healthy: boolean;
  draining: boolean;
  capacity: number;
}

interface ModelLease {
  index: number;
  lease: BackendLease;
  backendId: string;
  failovers: number;
  released: boolean;
  /** The model saw this lease's backend removed or unhealthy since the lease was pinned there. */
  mayMove: boolean;
  pending?: { settled: boolean; result?: LeaseResult; error?: unknown };
}

const flush = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

class Model {
  readonly backends = new Map<string, ModelBackend>();
  readonly leases: ModelLease[] = [];

  eligible(): ModelBackend[] {
    return [...this.backends.values()].filter((b) => b.healthy && !b.draining);
  }

  load(id: string): LoadKey {
    const here = this.leases.filter((l) => l.backendId === id);
    return {
      id,
      capacity: this.backends.get(id)?.capacity ?? 1,
      inflightTrajectories: here.filter((l) => !l.released).length,
      inflightRequests: here.filter((l) => l.pending !== undefined && !l.pending.settled).length,
    };
  }

  /** The reference pick: the least weighted load among eligible backends, by the reference order. */
  expectedPick(): string | undefined {
    return referenceOrder(this.eligible().map((b) => this.load(b.id)))[0]?.id;
  }

  markUnusable(id: string): void {
    for (const lease of this.leases) if (lease.backendId === id) lease.mayMove = true;
  }

  busyLeases(id: string): number {
    return this.leases.filter((l) => l.backendId === id && !l.released && l.pending !== undefined && !l.pending.settled).length;
  }
}

async function runScenario(ops: readonly Op[]): Promise<void> {
  const pool = new BackendPool({ acquireTimeoutMs: 5_000, maxFailoversPerRequest: 10, defaultMaxConcurrency: DEFAULT_CAPACITY });
  const model = new Model();
  const clients = new Map<string, InMemoryEngineClient>();
  /** The answer each unconfigured engine will give when asked its capacity, until a `report` op gives it. */
  const reports = new Map<string, (info: EngineServerInfo) => void>();
  let nextId = 0;
  const pickBackend = (n: number): ModelBackend | undefined => [...model.backends.values()][n % Math.max(1, model.backends.size)];
  const pickLease = (n: number, filter: (l: ModelLease) => boolean): ModelLease | undefined => {
    const candidates = model.leases.filter(filter);
    return candidates[n % Math.max(1, candidates.length)];
  };

  const check = (): void => {
    // Observe lease moves: only off a backend the model saw go away, onto one that may take trajectories.
    for (const l of model.leases) {
      if (l.lease.backendId !== l.backendId) {
        expect(l.mayMove, `lease ${l.index} moved off healthy ${l.backendId}`).toBe(true);
        const to = model.backends.get(l.lease.backendId);
        expect(to !== undefined && to.healthy && !to.draining, `lease ${l.index} moved to ineligible ${l.lease.backendId}`).toBe(true);
        l.backendId = l.lease.backendId;
        l.failovers++;
        l.mayMove = false;
      }
      expect(l.lease.failovers).toBe(l.failovers);
      const p = l.pending;
      if (p?.settled && p.error !== undefined) {
        // The only way a request may fail here: its lease was released and its backend removed under it.
        expect(l.released).toBe(true);
        expect((p.error as RolloutError).code).toBe('failed_precondition');
      }
    }
    for (const b of [...model.backends.values()]) {
      if (b.draining && model.load(b.id).inflightTrajectories === 0) model.backends.delete(b.id);
    }
    const actual = pool.list();
    expect(actual.map((b) => b.id).sort()).toEqual([...model.backends.keys()].sort());
    for (const b of actual) {
      const m = model.backends.get(b.id)!;
      expect({ id: b.id, healthy: b.healthy, draining: b.draining, capacity: b.maxConcurrency }).toEqual(m);
      const load = model.load(b.id);
      expect({ id: b.id, t: b.inflightTrajectories, r: b.inflightRequests }).toEqual({ id: b.id, t: load.inflightTrajectories, r: load.inflightRequests });
    }
    const expected = model.expectedPick();
    const picked = pool.pick();
    expect(picked.type === 'pick' ? picked.backend.id : undefined).toBe(expected);
    expect(pool.stats().leases).toBe(model.leases.filter((l) => !l.released).length);
  };

  for (const op of ops) {
    switch (op.kind) {
      case 'add': {
        const id = `b${nextId++}`;
        const answer = new Promise<EngineServerInfo>((resolve) => reports.set(id, resolve));
        const client = new InMemoryEngineClient({ url: `memory://${id}`, ...(op.maxConcurrency === 0 && { serverInfo: () => answer }) });
        clients.set(id, client);
        pool.add(client, { id, maxConcurrency: op.maxConcurrency, model: 'm', healthy: op.healthy });
        model.backends.set(id, { id, healthy: op.healthy, draining: false, capacity: op.maxConcurrency || DEFAULT_CAPACITY });
        break;
      }
      case 'report': {
        // The engine of an unconfigured backend answers with its capacity: the key and the slot limit change.
        const b = pickBackend(op.pick);
        const configured = b === undefined || clients.get(b.id)!.serverInfo === undefined;
        if (b === undefined || configured || !reports.has(b.id)) break;
        reports.get(b.id)!({ maxConcurrency: op.capacity });
        reports.delete(b.id);
        await pool.learn(b.id);
        b.capacity = op.capacity;
        break;
      }
      case 'remove': {
        const b = pickBackend(op.pick);
        if (b === undefined) break;
        const othersEligible = model.eligible().some((x) => x.id !== b.id);
        if (!op.drain && model.busyLeases(b.id) > 0 && !othersEligible) break; // its requests would have nowhere to go
        void pool.remove(b.id, { drain: op.drain });
        if (op.drain && model.load(b.id).inflightTrajectories > 0) {
          b.draining = true;
        } else {
          model.backends.delete(b.id);
          model.markUnusable(b.id);
        }
        break;
      }
      case 'health': {
        const b = pickBackend(op.pick);
        if (b === undefined) break;
        if (!op.healthy && model.busyLeases(b.id) > 0 && !model.eligible().some((x) => x.id !== b.id)) break;
        pool.setHealthy(b.id, op.healthy);
        b.healthy = op.healthy;
        if (!op.healthy) model.markUnusable(b.id);
        break;
      }
      case 'acquire': {
        const expected = model.expectedPick();
        if (expected === undefined) break; // waiting is covered by the example tests
        const index = model.leases.length;
        const lease = await pool.acquire(`t${index}`);
        expect(lease.backendId).toBe(expected);
        model.leases.push({ index, lease, backendId: expected, failovers: 0, released: false, mayMove: false });
        break;
      }
      case 'release': {
        const l = pickLease(op.pick, () => true);
        if (l === undefined) break;
        l.lease.release(); // possibly a second time: must be a no-op
        l.released = true;
        break;
      }
      case 'start': {
        const l = pickLease(op.pick, (x) => !x.released && (x.pending === undefined || x.pending.settled));
        if (l === undefined) break;
        const home = model.backends.get(l.backendId);
        if (!(home?.healthy ?? false) && model.eligible().length === 0) break; // failover would wait
        const pending: NonNullable<ModelLease['pending']> = { settled: false };
        l.pending = pending;
        l.lease.generate({ promptIds: [l.index], maxTokens: 1, signal: new AbortController().signal }).then(
          (result) => Object.assign(pending, { settled: true, result }),
          (error: unknown) => Object.assign(pending, { settled: true, error }),
        );
        break;
      }
      case 'finish': {
        const l = pickLease(op.pick, (x) => x.pending !== undefined && !x.pending.settled);
        if (l === undefined) break;
        const owner = [...clients.entries()].find(([, c]) => c.pending.some((p) => p.request.promptIds[0] === l.index));
        if (owner === undefined) break; // still queued behind other requests
        owner[1].pending.find((p) => p.request.promptIds[0] === l.index)!.resolve();
        await flush();
        expect(l.pending!.result?.backendId).toBe(owner[0]);
        expect(owner[0]).toBe(l.lease.backendId); // stickiness: served where the lease lives
        break;
      }
    }
    await flush();
    check();
  }

  // Wind down: answer everything, release everything; every counter must return to zero.
  for (const l of model.leases) {
    l.lease.release();
    l.released = true;
  }
  for (let round = 0; round < 200 && model.leases.some((l) => l.pending !== undefined && !l.pending.settled); round++) {
    for (const c of clients.values()) c.pending[0]?.resolve();
    await flush();
  }
  await flush();
  check();
  expect(pool.stats()).toMatchObject({ leases: 0, inflightTrajectories: 0, inflightRequests: 0, queuedRequests: 0, waitingAcquires: 0 });
  expect(pool.list().some((b) => b.draining)).toBe(false);
  pool.close();
}

describe('BackendPool properties', () => {
  it('always picks the eligible backend with the least load for its capacity, keeps leases sticky, and returns every count to zero', async () => {
    const scenario = fc
      .tuple(fc.array(addArb, { minLength: 1, maxLength: 3 }), fc.array(opArb, { minLength: 10, maxLength: 80 }))
      .map(([adds, ops]) => [...adds, ...ops]);
    await fc.assert(fc.asyncProperty(scenario, runScenario), { numRuns: 300 });
  });

  it('survives a scenario with heavy churn around in-flight requests', async () => {
    const churn: Op[] = [
      { kind: 'add', healthy: true, maxConcurrency: 1 },
      { kind: 'add', healthy: true, maxConcurrency: 1 },
      { kind: 'acquire' },
      { kind: 'acquire' },
      { kind: 'acquire' },
      { kind: 'start', pick: 0 },
      { kind: 'start', pick: 1 },
      { kind: 'start', pick: 2 },
      { kind: 'health', pick: 0, healthy: false },
      { kind: 'remove', pick: 1, drain: false },
      { kind: 'add', healthy: true, maxConcurrency: 2 },
      { kind: 'finish', pick: 0 },
      { kind: 'remove', pick: 0, drain: true },
      { kind: 'finish', pick: 0 },
      { kind: 'release', pick: 1 },
    ];
    await runScenario(churn);
  });
});

describe('compareLoad', () => {
  const keyArb = fc.record({
    id: fc.constantFrom('a', 'b', 'c', 'd'),
    capacity: fc.integer({ min: 1, max: 64 }),
    inflightTrajectories: fc.nat(200),
    inflightRequests: fc.nat(200),
  });

  it('orders exactly as the reference key (weighted load, then requests per capacity, then id)', () => {
    fc.assert(
      fc.property(fc.array(keyArb, { maxLength: 12 }), (keys) => {
        const sorted = [...keys].sort(compareLoad);
        const reference = referenceOrder(keys);
        // Same order up to keys that are equal in every respect (same load, capacity-weighted requests and id).
        for (let i = 0; i < sorted.length; i++) expect(compareLoad(sorted[i]!, reference[i]!)).toBe(0);
      }),
    );
  });

  it('is antisymmetric and transitive', () => {
    fc.assert(
      fc.property(keyArb, keyArb, keyArb, (x, y, z) => {
        expect(Math.sign(compareLoad(x, y))).toBe(-Math.sign(compareLoad(y, x)));
        if (compareLoad(x, y) <= 0 && compareLoad(y, z) <= 0) expect(compareLoad(x, z)).toBeLessThanOrEqual(0);
      }),
    );
  });
});
