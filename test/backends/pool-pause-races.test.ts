import { describe, expect, it } from 'vitest';
import type { GenerateRequest, PauseMode } from '../../src/backends/types.js';
import { SglangClient } from '../../src/backends/sglang-client.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { RolloutError } from '../../src/errors.js';
import { FakeSglangEngine } from '../../src/testing/fake-sglang.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { InMemoryEngineClient } from '../../src/testing/in-memory-engine.js';
import type { BackendPool, BackendPoolOptions } from '../../src/backends/pool.js';
import { poolSuite } from '../support/pool-suite.js';

// PauseGeneration / ResumeGeneration against what goes wrong around a weight sync: an engine that is down, a resume
// that overtakes a pause still under way, a paused engine removed (or its rollout server restarted) before the
// resume. The state that matters is the engine's own (is it paused?) against the pool's (is its gate open?): the two
// must never end up as "engine paused behind an open gate", where every request waits in the engine until it times
// out. Engines: the fake vLLM over real HTTP (its dev-mode pause routes), or the in-memory double with a pause call
// the test completes.

const suite = poolSuite({ pool: { acquireTimeoutMs: 500, healthTimeoutMs: 500 }, question: 'What is 17 * 23 + 5?' });
const makePool = suite.makePool;
/**
 * The resume-on-recovery mechanism (resumePending) on its own: a recovered backend serving a version other than 0 is
 * otherwise held until the trainer's next resume (holdRecoveredBackends, tested below), which supersedes it.
 */
const UNHELD: BackendPoolOptions = { holdRecoveredBackends: false };

async function fakeVllm(tokenLatencyMs = 0): Promise<{ engine: FakeVllmEngine; client: () => VllmClient }> {
  const engine = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs, devMode: true }));
  return { engine, client: () => new VllmClient({ url: engine.url, model: engine.model, requestTimeoutMs: 2_000 }) };
}

const ask = (): GenerateRequest => ({ promptIds: suite.prompt, maxTokens: 32, seed: 3, signal: AbortSignal.timeout(3_000) });
const outcome = (p: Promise<unknown>): Promise<string> =>
  p.then(
    () => 'ok',
    (e: unknown) => (e instanceof RolloutError ? `${e.code}: ${e.message}` : String(e)),
  );

/** The in-memory double with a pause of its own whose call the test completes, and a health the test sets. */
class ControlledEngine extends InMemoryEngineClient {
  pausedInEngine = false;
  readonly pauseCalls: { mode: PauseMode; finish: () => void }[] = [];
  resumeCalls = 0;
  autoFinish = false;
  pause(mode: PauseMode): Promise<void> {
    return new Promise<void>((resolve) => {
      const finish = (): void => {
        this.pausedInEngine = true;
        resolve();
      };
      this.pauseCalls.push({ mode, finish });
      if (this.autoFinish) finish();
    });
  }
  resume(): Promise<void> {
    this.resumeCalls++;
    if (!this.healthy) return Promise.reject(new Error('connection refused'));
    this.pausedInEngine = false;
    return Promise.resolve();
  }
}

describe('an engine that is down during a weight sync', () => {
  it('a pool-wide pause and resume succeed on the live engines; the dead one neither fails nor stalls them', async () => {
    const live = await fakeVllm();
    const dead = await fakeVllm();
    const pool = makePool();
    pool.add(live.client(), { id: 'live', maxConcurrency: 4, model: live.engine.model, maxModelLen: 40960 });
    pool.add(dead.client(), { id: 'dead', maxConcurrency: 4, model: dead.engine.model, maxModelLen: 40960 });
    await dead.engine.close();
    await pool.probeHealth();
    await pool.probeHealth();
    expect(pool.list().map((b) => [b.id, b.healthy])).toEqual([['live', true], ['dead', false]]);
    expect(await outcome(pool.pause('abort'))).toBe('ok');
    expect(live.engine.paused).toBe(true);
    expect(await outcome(pool.resume({ policyVersion: 1 }))).toBe('ok');
    expect(live.engine.paused).toBe(false);
    // Naming the dead engine still calls it, and says it failed.
    expect(await outcome(pool.pause('abort', { id: 'dead' }))).toMatch(/^failed_precondition: could not pause dead/);
  });

  it('an engine paused, then down at the resume, is resumed when it is healthy again; its gate stays closed until then', async () => {
    const engine = new ControlledEngine();
    engine.autoFinish = true;
    const pool = makePool(UNHELD);
    pool.add(engine, { id: 'a', maxConcurrency: 2, model: 'm' });
    await pool.pause('abort');
    expect(engine.pausedInEngine).toBe(true);
    engine.healthy = false;
    await pool.probeHealth();
    await pool.probeHealth();
    expect(pool.list()[0]).toMatchObject({ healthy: false, paused: true });
    expect(await outcome(pool.resume({ policyVersion: 2 }))).toBe('ok');
    expect(engine.resumeCalls).toBe(0); // not called while down
    expect(pool.list()[0]).toMatchObject({ paused: true, policyVersion: 2 });
    engine.healthy = true;
    await pool.probeHealth();
    await expect.poll(() => pool.list()[0]!.paused).toBe(false);
    expect(engine.pausedInEngine).toBe(false);
    expect(engine.resumeCalls).toBe(1);
  });
});

describe('a resume that overtakes a pause still under way', () => {
  it('WAIT: the pause does not pause the engine once the resume started; it answers aborted', async () => {
    const { engine, client } = await fakeVllm(20); // ~600 ms per answer: the pause surely waits on it
    const pool = makePool();
    pool.add(client(), { id: 'v', maxConcurrency: 4, model: engine.model, maxModelLen: 40960 });
    const lease = await pool.acquire('t');
    const running = lease.generate(ask());
    await expect.poll(() => engine.inflightRequestIds().length).toBe(1);
    const pausing = outcome(pool.pause('wait', { id: 'v' }));
    await new Promise((resolve) => setTimeout(resolve, 10));
    await pool.resume({ id: 'v', policyVersion: 1 });
    await running;
    expect(await pausing).toMatch(/^aborted: the pause of v was superseded by a ResumeGeneration/);
    expect(pool.list()[0]!.paused).toBe(false);
    expect(engine.paused).toBe(false);
    expect((await lease.generate(ask())).finishReason).toBe('stop');
  });

  it('ABORT: a resume while the engine pause call is out is not left behind: the engine is resumed again', async () => {
    const engine = new ControlledEngine();
    const pool = makePool();
    pool.add(engine, { id: 'a', maxConcurrency: 2, model: 'm' });
    const pausing = outcome(pool.pause('abort', { id: 'a', signal: AbortSignal.timeout(2_000) }));
    await expect.poll(() => engine.pauseCalls.length).toBe(1);
    await pool.resume({ id: 'a', policyVersion: 2 }); // aborts the pause call; the engine may see it first ...
    engine.pauseCalls[0]!.finish(); // ... and then pause (this double ignores the abort and answers late)
    expect(await pausing).toMatch(/^aborted: /);
    // Resumed again, and its gate open once it is.
    await expect.poll(() => [pool.list()[0]!.paused, engine.pausedInEngine]).toEqual([false, false]);
  });

  it('a pause that starts after a resume keeps its gate closed when that resume finishes', async () => {
    const engine = new ControlledEngine();
    engine.autoFinish = true;
    const pool = makePool();
    pool.add(engine, { id: 'a', maxConcurrency: 2, model: 'm' });
    await pool.pause('keep');
    const resuming = pool.resume({ policyVersion: 1 });
    await pool.pause('keep'); // the next sync begins before the resume's engine call came back
    await resuming;
    expect(pool.list()[0]!.paused).toBe(true);
    expect(engine.pausedInEngine).toBe(true);
  });
});

describe('a paused engine that leaves the pool before the resume', () => {
  it('removed while paused: its engine is resumed on the way out, so adding it back works', async () => {
    const { engine, client } = await fakeVllm();
    const pool = makePool();
    pool.add(client(), { id: 'v', maxConcurrency: 4, model: engine.model, maxModelLen: 40960 });
    await pool.pause('abort');
    await pool.remove('v', { drain: false });
    expect(engine.paused).toBe(false);
    await pool.resume({ policyVersion: 1 });
    pool.add(client(), { id: 'v2', maxConcurrency: 8, model: engine.model, maxModelLen: 40960 });
    const lease = await pool.acquire('t2');
    expect((await lease.generate(ask())).finishReason).toBe('stop');
  });

  it('restored paused from the journal: an engine without a pause of its own is held at its gate and released by the resume', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient(), { id: 'plain', maxConcurrency: 1, model: 'm' });
    pool.restoreWeights({ paused: true, policyVersion: 3 });
    expect(pool.list()[0]).toMatchObject({ paused: true, policyVersion: 3 });
    expect(await outcome(pool.resume({ policyVersion: 4 }))).toBe('ok');
    expect(pool.list()[0]).toMatchObject({ paused: false, policyVersion: 4 });
  });

  it('its rollout server restarted between the pause and the resume: the new server\'s resume resumes the engine', async () => {
    const { engine, client } = await fakeVllm();
    const before = makePool();
    before.add(client(), { id: 'v', maxConcurrency: 4, model: engine.model, maxModelLen: 40960 });
    await before.pause('abort');
    before.close(); // a crash or redeploy while the trainer pushes weights
    const after = makePool();
    after.add(client(), { id: 'v', maxConcurrency: 4, model: engine.model, maxModelLen: 40960 });
    await after.resume({ policyVersion: 1 });
    expect(engine.paused).toBe(false);
    const lease = await after.acquire('t');
    expect((await lease.generate(ask())).finishReason).toBe('stop');
  });
});

const flush = async (): Promise<void> => {
  for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve));
};

/**
 * The in-memory double as an engine whose pause state is `paused`: each call applies its effect and answers when the
 * test says (`auto`: at once), and a call's effect and its answer can be split, so every interleaving of the pool's
 * calls with the engine's handling of them can be staged.
 */
interface Call { op: 'pause' | 'resume'; mode?: PauseMode; apply: () => void; reply: () => void; finish: () => void; fail: () => void }

/** Engine truth in `paused`; calls auto-complete unless `auto` is false; a call's effect (apply) and answer (reply) can be split. */
class Engine extends InMemoryEngineClient {
  paused = false;
  auto = true;
  failResume = 0;
  failPauseWhenDown = true;
  readonly ops: Call[] = [];
  #call(op: 'pause' | 'resume', mode?: PauseMode): Promise<void> {
    if (!this.healthy && (op === 'resume' || this.failPauseWhenDown)) return Promise.reject(new Error('connection refused'));
    if (op === 'resume' && this.failResume > 0) {
      this.failResume--;
      return Promise.reject(new Error('resume failed (transient)'));
    }
    return new Promise<void>((resolve) => {
      let applied = false;
      const apply = (): void => {
        if (applied) return;
        applied = true;
        this.paused = op === 'pause';
      };
      const c: Call = { op, ...(mode && { mode }), apply, reply: () => resolve(), finish: () => (apply(), resolve()), fail: () => undefined };
      this.ops.push(c);
      if (this.auto) c.finish();
    });
  }
  pause(mode: PauseMode): Promise<void> {
    return this.#call('pause', mode);
  }
  resume(): Promise<void> {
    return this.#call('resume');
  }
}

function setup(options: BackendPoolOptions = {}): { pool: BackendPool; engine: Engine } {
  const engine = new Engine();
  const pool = makePool(options);
  pool.add(engine, { id: 'a', maxConcurrency: 2, model: 'm' });
  return { pool, engine };
}

describe('pause and resume calls that overlap (one engine call at a time, in the pool\'s order)', () => {
  it('a pause issued while a resume is out runs after it: the engine ends paused, the pool knows it, a removal resumes it', async () => {
    const { pool, engine } = setup();
    await pool.pause('keep');
    expect(engine.paused).toBe(true);
    engine.auto = false;
    const resuming = pool.resume({ policyVersion: 1 });
    const resumeCall = engine.ops.at(-1)!;
    resumeCall.apply(); // the engine resumes now, its answer is slow
    engine.auto = true;
    expect(await outcome(pool.pause('keep'))).toBe('ok'); // next sync: engine paused again
    expect(engine.paused).toBe(true);
    resumeCall.reply(); // the old resume's answer arrives: the pool sets enginePaused = false
    await resuming;
    expect(pool.list()[0]!.paused).toBe(true);
    // the engine is paused; removing it must resume it on the way out
    await pool.remove('a', { drain: false });
    expect(engine.paused).toBe(false);
  });

  it('so a later resume whose engine call fails says so instead of opening the gate on a paused engine', async () => {
    const { pool, engine } = setup();
    await pool.pause('keep');
    engine.auto = false;
    const resuming = pool.resume({ policyVersion: 1 });
    const resumeCall = engine.ops.at(-1)!;
    resumeCall.apply();
    engine.auto = true;
    await pool.pause('keep');
    resumeCall.reply();
    await resuming;
    engine.failResume = 1;
    const r = await outcome(pool.resume({ policyVersion: 2 }));
    // invariant: never "engine paused behind an open gate" after an ok resume
    expect({ r, gateOpen: !pool.list()[0]!.paused, enginePaused: engine.paused }).not.toEqual({ r: 'ok', gateOpen: true, enginePaused: true });
  });

  it('a pause overtaken by a resume whose engine call answers late does not undo a later pause', async () => {
    const { pool, engine } = setup();
    engine.auto = false;
    const p1 = outcome(pool.pause('keep', { id: 'a' }));
    await flush();
    const p1Call = engine.ops.at(-1)!;
    expect(p1Call.op).toBe('pause');
    engine.auto = true;
    expect(await outcome(pool.resume({ id: 'a', policyVersion: 1 }))).toBe('ok');
    expect(await outcome(pool.pause('keep', { id: 'a' }))).toBe('ok'); // P2: in effect now
    expect(engine.paused).toBe(true);
    p1Call.finish(); // P1's call comes back (engine paused again): P1 sees itself superseded and resumes the engine
    expect(await p1).toMatch(/^aborted/);
    expect(pool.list()[0]!.paused).toBe(true); // P2's gate is closed ...
    expect(engine.paused).toBe(true); // ... but is the engine still paused (keep: frozen requests must stay frozen)?
  });

  it('a pause overtaken by a resume that answers late is resumed again; if that fails, its gate stays closed', async () => {
    const { pool, engine } = setup();
    engine.auto = false;
    const p1 = outcome(pool.pause('abort', { id: 'a' }));
    await flush();
    const p1Call = engine.ops.at(-1)!;
    engine.auto = true;
    expect(await outcome(pool.resume({ id: 'a', policyVersion: 1 }))).toBe('ok');
    engine.failResume = 1;
    p1Call.finish();
    expect(await p1).toMatch(/^aborted: /);
    await flush();
    // Never an engine paused behind an open gate: held until a probe's retry resumes it.
    expect({ gateOpen: !pool.list()[0]!.paused, enginePaused: engine.paused }).toEqual({ gateOpen: false, enginePaused: true });
    await pool.probeHealth();
    await expect.poll(() => [!pool.list()[0]!.paused, engine.paused]).toEqual([true, false]);
  });
});

describe('engines down or leaving around a weight sync, restarted servers', () => {
  it('a recovered engine whose first resume fails is retried at each probe while it stays healthy', async () => {
    const { pool, engine } = setup(UNHELD);
    await pool.pause('abort');
    engine.healthy = false;
    await pool.probeHealth();
    await pool.probeHealth();
    expect(await outcome(pool.resume({ policyVersion: 2 }))).toBe('ok');
    engine.healthy = true;
    engine.failResume = 1;
    await pool.probeHealth();
    await flush();
    for (let i = 0; i < 3; i++) {
      await pool.probeHealth();
      await flush();
    }
    expect(engine.paused).toBe(false);
    expect(pool.list()[0]!.paused).toBe(false);
  });

  it('after a restart during a pool-wide pause, an engine down at the resume is resumed when it recovers (the old server paused it)', async () => {
    const { pool, engine } = setup(UNHELD);
    engine.paused = true; // left paused by the server before the restart
    pool.restoreWeights({ paused: true, policyVersion: 7 });
    engine.healthy = false;
    await pool.probeHealth();
    await pool.probeHealth();
    expect(await outcome(pool.resume({ policyVersion: 8 }))).toBe('ok');
    engine.healthy = true;
    await pool.probeHealth();
    await expect.poll(() => [!pool.list()[0]!.paused, engine.paused]).toEqual([true, false]);
  });

  it('a backend removed while its pause call is out: the engine is resumed, not left paused', async () => {
    const { pool, engine } = setup();
    engine.auto = false;
    const p = outcome(pool.pause('abort'));
    await flush();
    const call = engine.ops.at(-1)!;
    engine.auto = true; // the engine answers what comes next at once
    await pool.remove('a', { drain: false });
    call.finish(); // ... and the pause it had not answered applies now
    // Not the caller's business any more: the pause answers for the backends still in the pool (none).
    expect(await p).toBe('ok');
    await expect.poll(() => engine.paused).toBe(false);
  });

  it('a backend removed while a pool-wide WAIT pause waits for its requests: the pause answers OK for the others, all paused', async () => {
    const pool = makePool();
    const a = new Engine();
    const b = new Engine();
    pool.add(a, { id: 'a', maxConcurrency: 2, model: 'm' });
    pool.add(b, { id: 'b', maxConcurrency: 2, model: 'm' });
    // A request in flight on each engine: the WAIT pause waits for both.
    const leases = [await pool.acquire('t1'), await pool.acquire('t2')];
    const running = leases.map((l) => outcome(l.generate({ promptIds: [1, 2], maxTokens: 4, signal: new AbortController().signal })));
    await expect.poll(() => a.pending.length + b.pending.length).toBe(2);
    const pausing = pool.pause('wait').then(
      (paused) => paused.map((x) => [x.id, x.paused]),
      (e: unknown) => (e instanceof RolloutError ? `${e.code}: ${e.message}` : String(e)),
    );
    await flush();
    await pool.remove('b', { drain: false }); // an operator takes b out; its request moves on (held: a is paused)
    a.pending[0]!.resolve({ tokenIds: [7], logprobs: [-1], finishReason: 'stop', text: '' });
    expect(await pausing).toEqual([['a', true]]);
    expect(a.paused).toBe(true);
    await pool.resume({ policyVersion: 1 });
    await expect.poll(() => a.pending.length).toBe(1); // the request that lost b, held until the resume
    a.pending[0]!.resolve({ tokenIds: [8], logprobs: [-1], finishReason: 'stop', text: '' });
    expect(await Promise.all(running)).toEqual(['ok', 'ok']);
    for (const l of leases) l.release();
  });

  it('a by-id pause that fails on a down engine keeps its pending resume: resumed on recovery', async () => {
    const { pool, engine } = setup(UNHELD);
    await pool.pause('abort');
    engine.healthy = false;
    await pool.probeHealth();
    await pool.probeHealth();
    await pool.resume({ policyVersion: 2 });
    const r = await outcome(pool.pause('abort', { id: 'a' }));
    expect(r).toMatch(/^failed_precondition: could not pause a .*left unpaused/);
    engine.healthy = true;
    await pool.probeHealth();
    await expect.poll(() => [!pool.list()[0]!.paused, engine.paused]).toEqual([true, false]);
  });
});

describe('an engine whose health check is a generation (SGLang) through a weight sync', () => {
  it('stays healthy through a pause that spans several probe rounds, and the pool-wide resume resumes it', async () => {
    // SGLang's /health_generate waits at the pause like any request (the fake SGLang holds it so): probed there, the
    // paused engine failed every probe, was marked unhealthy, and the pool-wide resume then waited for a probe that
    // could not pass — the engine stayed paused for good.
    const sglang = suite.track(await FakeSglangEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 5 }));
    const pool = suite.makePool({ healthTimeoutMs: 300, healthFailureThreshold: 2 });
    pool.add(new SglangClient({ url: sglang.url, model: 'm' }), { id: 's', maxConcurrency: 4, model: 'm', maxModelLen: 40959 });
    for (const mode of ['keep', 'abort'] as const) {
      const lease = await pool.acquire(`t-${mode}`);
      const running = lease.generate({ ...ask(), maxTokens: 200, signal: AbortSignal.timeout(10_000) });
      await expect.poll(() => sglang.inflightRequestIds().length).toBe(1);
      await pool.pause(mode);
      expect(sglang.paused).toBe(true);
      for (let round = 0; round < 3; round++) await pool.probeHealth(); // the weight update, as long as it takes
      expect(pool.list()[0]!.healthy).toBe(true);
      await pool.resume({ policyVersion: mode === 'keep' ? 1 : 2 });
      expect(sglang.paused).toBe(false);
      const out = await running;
      expect(out.finishReason).toBe(mode === 'keep' ? 'stop' : 'abort');
      lease.release();
      expect(pool.list()[0]!.healthy).toBe(true);
    }
  });

  it('gets its check\u2019s own delay on top of the pool\u2019s probe budget (SGLang answers after a second at the least)', async () => {
    const sglang = suite.track(await FakeSglangEngine.start({ tokenizer: suite.tokenizer, healthDelayMs: 1_000 }));
    const pool = suite.makePool({ healthTimeoutMs: 300, healthFailureThreshold: 1 });
    pool.add(new SglangClient({ url: sglang.url, model: 'm' }), { id: 's', maxConcurrency: 4, model: 'm', maxModelLen: 40959 });
    await pool.probeHealth();
    expect(pool.list()[0]!.healthy).toBe(true);
    sglang.setHealthy(false);
    await pool.probeHealth();
    expect(pool.list()[0]!.healthy).toBe(false);
  });
});

describe('a backend back after it was down, while the pool serves updated weights (holdRecoveredBackends)', () => {
  it('is held until the trainer\u2019s next resume (it may have restarted with other weights); at version 0 it is not', async () => {
    const pool = makePool();
    const a = new InMemoryEngineClient({ respond: () => ({ tokenIds: [7], logprobs: [-1], finishReason: 'stop', text: '' }) });
    const b = new InMemoryEngineClient({ respond: () => ({ tokenIds: [8], logprobs: [-1], finishReason: 'stop', text: '' }) });
    pool.add(a, { id: 'a', maxConcurrency: 4, model: 'm' });
    pool.add(b, { id: 'b', maxConcurrency: 4, model: 'm' });
    // Version 0 (weights never updated): a blip or a restart serves the same weights, no hold.
    pool.setHealthy('a', false);
    pool.setHealthy('a', true);
    expect(pool.list().map((x) => [x.id, x.paused])).toEqual([['a', false], ['b', false]]);

    await pool.resume({ policyVersion: 3 });
    pool.setHealthy('a', false);
    pool.setHealthy('a', true);
    // Held: new trajectories go to b, a request sent to a waits at its gate (nothing sampled with unknown weights).
    expect(pool.list().map((x) => [x.id, x.paused, x.policyVersion])).toEqual([['a', true, 3], ['b', false, 3]]);
    const lease = await pool.acquire('t');
    expect(lease.backendId).toBe('b');
    lease.release();
    // The trainer's next weight sync: its resume confirms a's weights and version.
    await pool.resume({ policyVersion: 4 });
    expect(pool.list().map((x) => [x.id, x.paused, x.policyVersion])).toEqual([['a', false, 4], ['b', false, 4]]);
  });

  it('can be turned off: the engine takes trajectories at once with the pool\u2019s version', async () => {
    const pool = makePool({ holdRecoveredBackends: false });
    pool.add(new InMemoryEngineClient(), { id: 'a', maxConcurrency: 4, model: 'm' });
    await pool.resume({ policyVersion: 3 });
    pool.setHealthy('a', false);
    pool.setHealthy('a', true);
    expect(pool.list().map((x) => [x.id, x.paused])).toEqual([['a', false]]);
  });
});

