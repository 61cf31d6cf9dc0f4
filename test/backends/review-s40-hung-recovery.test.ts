import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { Backend } from '../../gen/ts/rollout/v1/backend.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { toBackend } from '../../src/contract/backend-service.js';
import { RolloutError } from '../../src/errors.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { InMemoryEngineClient } from '../../src/testing/in-memory-engine.js';
import { mathTask, startHarness, type Harness } from '../support/harness.js';
import { poolSuite } from '../support/pool-suite.js';
import { eventually, within } from '../support/wait.js';

// An engine found hung (the stall watchdog: unanswered requests, still work counters) and then working again, and an
// engine back after it was down while the weights have been updated (policy version > 0):
// - ListBackends / Watch showed neither the hung state nor how often: Backend.stalled, Backend.stalls (int64, a number
//   in the stubs as assigned_total) and a reason that says "hung", not "health checks failing" (its /health answers).
// - A hung engine whose counters went on was held until the next ResumeGeneration although it is the same process with
//   the weights it is labelled with; one whose counters went back (restarted) or that a weight sync relabelled while it
//   was hung is rightly held.
// - A held engine was eligible: in a one-engine pool every trajectory was placed on it and waited at its gate for a
//   ResumeGeneration a synchronous trainer sends only once its rollouts are done (until each run timeout: TIMEOUT).
//   Now it takes none: trajectories wait for another engine for acquireTimeoutMs, then end BACKEND_ERROR naming the
//   hold (Backend.weights_unknown shows it), and the trainer's resume takes it back.
//
// TEST DOUBLE: a raw HTTP server standing for a vLLM (/health 200, /v1/models, completions parked forever, a /metrics
// whose token counters the test sets). The working engine is the fake vLLM over real HTTP (also a double).

const suite = poolSuite({ question: 'What is 6 * 7?' });

interface StuckEngine {
  url: string;
  parked: ServerResponse[];
  tokens: number;
}

const servers: Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise<void>((resolve) => s.close(() => resolve()));
  }
});

async function stuckEngine(model: string): Promise<StuckEngine> {
  const engine: StuckEngine = { url: '', parked: [], tokens: 500 };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      const path = (req.url ?? '/').split('?')[0];
      if (req.method === 'GET' && path === '/health') return void res.writeHead(200).end();
      if (req.method === 'GET' && path === '/v1/models') {
        return void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ object: 'list', data: [{ id: model, object: 'model', max_model_len: 40960 }] }));
      }
      if (req.method === 'GET' && path === '/metrics') {
        const text = ['# TYPE vllm:prompt_tokens_total counter', `vllm:prompt_tokens_total{engine="0",model_name="${model}"} 120.0`, '# TYPE vllm:generation_tokens_total counter', `vllm:generation_tokens_total{engine="0",model_name="${model}"} ${engine.tokens}.0`, ''].join('\n');
        return void res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(text);
      }
      if (req.method === 'POST' && path === '/v1/completions') return void engine.parked.push(res);
      res.writeHead(404).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  servers.push(server);
  engine.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return engine;
}

/** A pool with a hung engine (found hung by the watchdog, its trajectory moved to `good`) at policy version 3. */
async function hungPool(): Promise<{ pool: ReturnType<typeof suite.makePool>; hung: StuckEngine }> {
  const hung = await stuckEngine('fake-qwen3');
  const good = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0 }));
  const pool = suite.makePool({ stallMs: 300, healthIntervalMs: 50, healthTimeoutMs: 2_000, acquireTimeoutMs: 30_000 });
  const client = (url: string): VllmClient => new VllmClient({ url, model: 'fake-qwen3', requestTimeoutMs: 600_000 });
  pool.add(client(hung.url), { id: 'hung', maxConcurrency: 8, model: 'fake-qwen3', maxModelLen: 40960 });
  pool.add(client(good.url), { id: 'good', maxConcurrency: 1, model: 'fake-qwen3', maxModelLen: 40960 });
  await pool.resume({ policyVersion: 3 });
  const lease = await pool.acquire('t');
  expect(lease.backendId).toBe('hung');
  pool.startHealthChecks();
  const answer = lease.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 1, signal: new AbortController().signal });
  await expect(within(answer, 30_000, 'the request to move off the hung engine')).resolves.toMatchObject({ backendId: 'good' });
  lease.release();
  expect(pool.list().find((b) => b.id === 'hung')).toMatchObject({ healthy: false, stalled: true, stalls: 1, weightsUnknown: false });
  return { pool, hung };
}

const hungInfo = (pool: ReturnType<typeof suite.makePool>) => pool.list().find((b) => b.id === 'hung')!;

describe('a hung engine that works again, at policy version 3', () => {
  it('whose counters went on from where they stood, with no weight sync meanwhile, is back at once (same process, same weights)', async () => {
    const { pool, hung } = await hungPool();
    hung.tokens = 501;
    await eventually(() => hungInfo(pool).healthy, 'the engine back once its counters moved');
    expect(hungInfo(pool)).toMatchObject({ stalled: false, stalls: 1, weightsUnknown: false, paused: false, policyVersion: 3 });
    expect(toBackend(hungInfo(pool))).toMatchObject({ healthy: true, unusableReason: '', stalled: false, stalls: 1, weightsUnknown: false });
    pool.stopHealthChecks();
  });

  it('whose counters went back (another process: restarted) is held until the trainer\u2019s resume confirms its weights', async () => {
    const { pool, hung } = await hungPool();
    hung.tokens = 3;
    await eventually(() => !hungInfo(pool).stalled, 'the engine found working again');
    expect(hungInfo(pool)).toMatchObject({ healthy: true, weightsUnknown: true, paused: true });
    expect(toBackend(hungInfo(pool))).toMatchObject({ healthy: false, weightsUnknown: true, unusableReason: expect.stringMatching(/^held until a ResumeGeneration confirms its weights/) as unknown });
    const next = await pool.acquire('t2');
    expect(next.backendId).toBe('good');
    next.release();
    await pool.resume({ policyVersion: 4 });
    expect(hungInfo(pool)).toMatchObject({ healthy: true, weightsUnknown: false, paused: false, policyVersion: 4 });
    pool.stopHealthChecks();
  });

  it('that a weight sync relabelled while it was hung (it may have missed the update) is held', async () => {
    const { pool, hung } = await hungPool();
    await pool.pause('wait');
    await pool.resume({ policyVersion: 4 });
    hung.tokens = 501;
    await eventually(() => !hungInfo(pool).stalled, 'the engine found working again');
    expect(hungInfo(pool)).toMatchObject({ healthy: true, weightsUnknown: true, paused: true, policyVersion: 4 });
    pool.stopHealthChecks();
  });
});

describe('an engine held since it came back (weights unknown) in a one-engine pool', () => {
  it('holds no trajectory for ever: a pinned one and a new one end backend_error after acquireTimeoutMs naming the hold; the resume takes it back', async () => {
    const engine = new InMemoryEngineClient({ respond: () => ({ tokenIds: [7], logprobs: [-1], finishReason: 'stop', text: '' }) });
    const pool = suite.makePool({ acquireTimeoutMs: 300 });
    pool.add(engine, { id: 'only', maxConcurrency: 4, model: 'm' });
    await pool.resume({ policyVersion: 3 });
    const pinned = await pool.acquire('pinned');
    pool.setHealthy('only', false); // a blip, or a restart: nothing tells them apart
    pool.setHealthy('only', true);
    expect(pool.list()[0]).toMatchObject({ healthy: true, paused: true, weightsUnknown: true });

    const ask = { promptIds: [1, 2, 3], maxTokens: 4, signal: AbortSignal.timeout(20_000) };
    const failed = await within(pinned.generate(ask).catch((e: unknown) => e), 10_000, 'the pinned trajectory\u2019s request');
    expect(failed).toBeInstanceOf(RolloutError);
    expect((failed as RolloutError).code).toBe('backend_error');
    expect((failed as RolloutError).message).toMatch(/held until a ResumeGeneration confirms its weights/);
    pinned.release();
    const refused = await within(pool.acquire('new').catch((e: unknown) => e), 10_000, 'a new trajectory\u2019s acquire');
    expect((refused as RolloutError).code).toBe('backend_error');
    expect((refused as RolloutError).message).toMatch(/only held until a ResumeGeneration confirms its weights/);

    // A trajectory waiting for an engine when the trainer's resume comes gets it at once.
    const waiting = pool.acquire('waiting');
    await pool.resume({ policyVersion: 4 });
    const lease = await within(waiting, 5_000, 'the waiting acquire after the resume');
    await expect(lease.generate({ ...ask, signal: AbortSignal.timeout(5_000) })).resolves.toMatchObject({ tokenIds: [7], policyVersion: 4, backendId: 'only' });
    lease.release();
    expect(pool.list()[0]).toMatchObject({ healthy: true, paused: false, weightsUnknown: false, policyVersion: 4 });
  });
});

describe('Backend.stalled and Backend.stalls on the wire', () => {
  it('survive encoding (stalls is an int64 the stubs give as a number, as assigned_total)', () => {
    const wire = Backend.decode(Backend.encode(Backend.fromPartial({ id: 'b', stalled: true, stalls: 3, weightsUnknown: true, assignedTotal: 9 })).finish());
    expect(wire).toMatchObject({ stalled: true, stalls: 3, weightsUnknown: true, assignedTotal: 9 });
    expect(typeof wire.stalls).toBe('number');
    expect(Backend.toJSON(wire)).toMatchObject({ stalled: true, stalls: 3, weightsUnknown: true });
  });

  describe('through a real server', () => {
    let h: Harness | undefined;
    afterEach(async () => {
      await h?.close();
      h = undefined;
    });

    it('ListBackends shows a hung engine as stalled, with its count and why; then held (weights_unknown, and its metric) when it works again after a weight sync relabelled it', async () => {
      h = await startHarness({ backendStallMs: 300, metrics: { port: 0 } });
      const hung = await stuckEngine(h.engine.model);
      // More capacity than the harness's engine (256): the first trajectory is placed on it.
      await h.client.addBackend({ url: hung.url, id: 'hung', maxConcurrency: 4096 });
      await h.client.submit(mathTask('hung-1', 1, 5));
      const got = await h.client.getTrajectory('hung-1', { wait: true, deadlineMs: 60_000 });
      expect(got.trajectories.map((t) => t.status)).toEqual([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED]);
      expect(hung.parked.length).toBeGreaterThanOrEqual(1);
      const listed = (await h.client.listBackends()).find((b) => b.id === 'hung');
      expect(listed).toMatchObject({ healthy: false, stalled: true, stalls: 1, weightsUnknown: false, unusableReason: expect.stringMatching(/^hung: /) as unknown });

      // A weight sync while it is hung (it is not called: it is down), then its counters move on.
      await h.client.resumeGeneration({ policyVersion: 2 });
      hung.tokens = 501;
      const heldNow = async (): Promise<boolean> => (await h!.client.listBackends()).find((b) => b.id === 'hung')?.weightsUnknown === true;
      await eventually(heldNow, 'the engine found working again, and held');
      expect((await h.client.listBackends()).find((b) => b.id === 'hung')).toMatchObject({
        healthy: false, paused: true, stalled: false, stalls: 1, weightsUnknown: true, policyVersion: 2,
        unusableReason: expect.stringMatching(/^held until a ResumeGeneration confirms its weights/) as unknown,
      });
      const scrape = async (): Promise<string> => (await fetch(`http://${h!.server.metrics!.address}/metrics`)).text();
      expect(await scrape()).toMatch(/^rollout_backend_weights_unknown\{backend="hung"\} 1$/m);
      // The trainer's next weight sync takes it back.
      await h.client.resumeGeneration({ policyVersion: 3 });
      expect((await h.client.listBackends()).find((b) => b.id === 'hung')).toMatchObject({ healthy: true, paused: false, weightsUnknown: false, policyVersion: 3, unusableReason: '' });
      expect(await scrape()).toMatch(/^rollout_backend_weights_unknown\{backend="hung"\} 0$/m);
    });
  });
});
