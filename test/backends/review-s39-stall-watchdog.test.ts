import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { sumCounters } from '../../src/backends/engine-progress.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { createLogger } from '../../src/observability/logger.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { poolSuite } from '../support/pool-suite.js';
import { eventually, within } from '../support/wait.js';

// A vLLM that accepts requests and never answers them (no headers, no byte) while its /health stays 200 was bounded only
// by backendRequestTimeoutMs (300 s): every trajectory placed on it waited that long. Silence before the headers cannot
// be read as a hang on its own (a non-streamed completion sends nothing until it is done), so the pool's stall watchdog
// reads the engine's work counters (Prometheus GET /metrics): no answer and no counter move for stallMs is a hung engine,
// whose requests fail over and which takes no trajectory until its counters move. A slow engine whose counters move is
// left alone; an engine without /metrics is not watched (as before).
//
// TEST DOUBLE: a raw HTTP server standing for a vLLM: /health 200, completions parked until the test answers them (or
// forever), and a /metrics whose token counters the test sets (or a 404). The healthy second engine is the fake vLLM
// over real HTTP (also a double). Windows are small; assertions are on outcomes, with generous upper bounds only.

const suite = poolSuite({ question: 'What is 6 * 7?' });

interface StuckEngine {
  url: string;
  /** Completions received, parked (answered only if the test does). */
  parked: Array<{ req: IncomingMessage; res: ServerResponse; body: string }>;
  /** What /metrics counts; undefined: /metrics is a 404. */
  tokens: number | undefined;
  /** Generating: every read of /metrics finds the generation counter moved. */
  moving: boolean;
  metricsReads: number;
  healthChecks: number;
  /** What /health answers. */
  healthStatus: number;
}

const servers: Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise<void>((resolve) => s.close(() => resolve()));
  }
});

async function stuckEngine(tokens: number | undefined): Promise<StuckEngine> {
  const engine: StuckEngine = { url: '', parked: [], tokens, moving: false, metricsReads: 0, healthChecks: 0, healthStatus: 200 };
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = (req.url ?? '/').split('?')[0];
      if (req.method === 'GET' && path === '/health') {
        engine.healthChecks++;
        return void res.writeHead(engine.healthStatus).end();
      }
      if (req.method === 'GET' && path === '/metrics') {
        engine.metricsReads++;
        if (engine.tokens === undefined) return void res.writeHead(404).end('Not Found');
        if (engine.moving) engine.tokens += 7;
        const text = [
          '# HELP vllm:num_requests_running Number of requests in model execution batches.',
          '# TYPE vllm:num_requests_running gauge',
          `vllm:num_requests_running{engine="0",model_name="fake-qwen3"} ${engine.parked.length}.0`,
          '# TYPE vllm:prompt_tokens_total counter',
          'vllm:prompt_tokens_total{engine="0",model_name="fake-qwen3"} 120.0',
          '# TYPE vllm:generation_tokens_total counter',
          `vllm:generation_tokens_total{engine="0",model_name="fake-qwen3"} ${engine.tokens}.0`,
          '',
        ].join('\n');
        return void res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(text);
      }
      if (req.method === 'POST' && path === '/v1/completions') return void engine.parked.push({ req, res, body: Buffer.concat(chunks).toString() });
      res.writeHead(404).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  servers.push(server);
  engine.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return engine;
}

function recordingLogger(): { logger: ReturnType<typeof createLogger>; logs: Array<Record<string, unknown>> } {
  const logs: Array<Record<string, unknown>> = [];
  const destination = new Writable({ write: (chunk, _enc, done) => (logs.push(JSON.parse(String(chunk)) as Record<string, unknown>), done()) });
  return { logger: createLogger({ level: 'info', destination }), logs };
}

const add = (pool: ReturnType<typeof suite.makePool>, id: string, url: string, maxConcurrency: number): void =>
  void pool.add(new VllmClient({ url, model: 'fake-qwen3', requestTimeoutMs: 600_000 }), { id, maxConcurrency, model: 'fake-qwen3', maxModelLen: 40960 });

describe('an engine that takes requests and never answers while its /health says 200', () => {
  it('is found hung by its still counters: the trajectory fails over long before the request timeout, and the engine stays out until its counters move', async () => {
    const hung = await stuckEngine(500);
    const good = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0 }));
    const { logger, logs } = recordingLogger();
    const pool = suite.makePool({ logger, stallMs: 300, healthIntervalMs: 50, healthTimeoutMs: 2_000, acquireTimeoutMs: 30_000 });
    add(pool, 'hung', hung.url, 8); // picked first: 8 slots against 1
    add(pool, 'good', good.url, 1);
    const lease = await pool.acquire('t');
    expect(lease.backendId).toBe('hung');
    pool.startHealthChecks();
    const answer = lease.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 1, signal: new AbortController().signal });
    await expect(within(answer, 30_000, 'the request to move off the hung engine')).resolves.toMatchObject({ backendId: 'good' });
    expect(lease.failovers).toBe(1);
    expect(hung.parked).toHaveLength(1);
    expect(pool.list().find((b) => b.id === 'hung')).toMatchObject({ healthy: false, stalled: true, stalls: 1 });
    expect(logs.some((l) => l.level === 40 && l.backend === 'hung' && String(l.msg).startsWith('engine hung'))).toBe(true);

    // Its /health keeps answering 200: passing probes do not bring it back, and no new trajectory goes there.
    const probes = hung.healthChecks;
    await eventually(() => hung.healthChecks >= probes + 5, 'more passing probes of the hung engine');
    expect(pool.list().find((b) => b.id === 'hung')).toMatchObject({ healthy: false, stalled: true });
    const next = await pool.acquire('t2');
    expect(next.backendId).toBe('good');
    next.release();

    // Its counters move (it works again): it takes trajectories again.
    hung.tokens = 501;
    await eventually(() => pool.list().find((b) => b.id === 'hung')?.healthy === true, 'the engine back once its counters moved');
    expect(pool.list().find((b) => b.id === 'hung')).toMatchObject({ stalled: false, stalls: 1 });
    pool.stopHealthChecks();
    lease.release();
  });

  it('a hung engine that then fails its health checks (restarting) comes back at its next passing probe', async () => {
    const hung = await stuckEngine(500);
    const good = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0 }));
    const pool = suite.makePool({ stallMs: 300, healthIntervalMs: 50, healthFailureThreshold: 2, acquireTimeoutMs: 30_000 });
    add(pool, 'hung', hung.url, 8);
    add(pool, 'good', good.url, 1);
    const lease = await pool.acquire('t');
    pool.startHealthChecks();
    const answer = lease.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 1, signal: new AbortController().signal });
    await expect(within(answer, 30_000, 'the request to move off the hung engine')).resolves.toMatchObject({ backendId: 'good' });
    expect(pool.list().find((b) => b.id === 'hung')).toMatchObject({ healthy: false, stalled: true });
    hung.healthStatus = 503; // it went down (a supervisor restarts it): no longer merely hung
    await eventually(() => pool.list().find((b) => b.id === 'hung')?.stalled === false, 'the hung mark lifted by a failed probe');
    expect(pool.list().find((b) => b.id === 'hung')?.healthy).toBe(false);
    hung.healthStatus = 200; // back (its counters the same: a restart does not always move them)
    await eventually(() => pool.list().find((b) => b.id === 'hung')?.healthy === true, 'the engine back at its next passing probe');
    pool.stopHealthChecks();
    lease.release();
  });

  it('a slow engine whose counters move is not declared hung: its request is left to finish', async () => {
    const slow = await stuckEngine(0);
    const good = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0 }));
    const pool = suite.makePool({ stallMs: 200, healthIntervalMs: 50, acquireTimeoutMs: 30_000 });
    add(pool, 'slow', slow.url, 8);
    add(pool, 'good', good.url, 1);
    const lease = await pool.acquire('t');
    expect(lease.backendId).toBe('slow');
    pool.startHealthChecks();
    const answer = lease.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 1, signal: new AbortController().signal });
    await eventually(() => slow.parked.length === 1, 'the request at the slow engine');
    // It generates: every read of its counters finds them moved. Many windows pass (reads are a quarter window apart).
    slow.moving = true;
    const reads = slow.metricsReads;
    await eventually(() => slow.metricsReads >= reads + 16, 'the watchdog to read the slow engine many times', 30_000);
    expect(pool.list().find((b) => b.id === 'slow')).toMatchObject({ healthy: true, stalled: false, stalls: 0 });
    expect(lease.backendId).toBe('slow');
    // Now it answers: the real answer of the fake vLLM to the very request it was sent.
    const { req, res, body } = slow.parked[0]!;
    const upstream = await fetch(`${good.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-request-id': String(req.headers['x-request-id']) }, body });
    res.writeHead(upstream.status, { 'content-type': 'application/json' }).end(await upstream.text());
    await expect(within(answer, 30_000, 'the slow answer')).resolves.toMatchObject({ backendId: 'slow' });
    expect(lease.failovers).toBe(0);
    pool.stopHealthChecks();
    lease.release();
  });

  it('an engine without /metrics is not watched (logged once): its request keeps waiting, as before', async () => {
    const quiet = await stuckEngine(undefined);
    const good = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0 }));
    const { logger, logs } = recordingLogger();
    const pool = suite.makePool({ logger, stallMs: 200, healthIntervalMs: 50, acquireTimeoutMs: 30_000 });
    add(pool, 'quiet', quiet.url, 8);
    add(pool, 'good', good.url, 1);
    const lease = await pool.acquire('t');
    pool.startHealthChecks();
    const controller = new AbortController();
    const answer = lease.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 1, signal: controller.signal }).catch((err: unknown) => err);
    await eventually(() => quiet.metricsReads === 1, 'the one read of its /metrics');
    const probes = quiet.healthChecks;
    await eventually(() => quiet.healthChecks >= probes + 20, 'many windows to pass'); // 20 probes 50 ms apart: 5 windows
    expect(quiet.metricsReads).toBe(1);
    expect(pool.list().find((b) => b.id === 'quiet')).toMatchObject({ healthy: true, stalled: false, stalls: 0 });
    expect(lease.backendId).toBe('quiet');
    expect(logs.filter((l) => String(l.msg).startsWith('engine serves no work counters'))).toHaveLength(1);
    controller.abort(new Error('test over'));
    await answer;
    pool.stopHealthChecks();
    lease.release();
  });
});

describe('sumCounters (Prometheus text)', () => {
  it('sums the named counters over their label sets, ignoring other metrics, comments and malformed lines', () => {
    const text = [
      '# TYPE vllm:generation_tokens_total counter',
      'vllm:generation_tokens_total{engine="0",model_name="a b}c"} 10.0',
      'vllm:generation_tokens_total{engine="1",model_name="m"} 2.5e+01 1700000000000',
      'vllm:generation_tokens_created{engine="0"} 1.7e9',
      'vllm:prompt_tokens_total 5',
      'vllm:prompt_tokens_total{engine="2"} NaN',
      'vllm:prompt_tokens_total{engine="3"}',
    ].join('\n');
    expect(sumCounters(text, ['vllm:prompt_tokens_total', 'vllm:generation_tokens_total'])).toBe(40);
    expect(sumCounters('<html>not found</html>', ['vllm:prompt_tokens_total'])).toBeUndefined();
  });
});
