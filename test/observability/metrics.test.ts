import { createServer } from 'node:net';
import { describe, expect, it } from 'vitest';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { RolloutError } from '../../src/errors.js';
import { collect, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { spawnServe } from '../support/rollout-process.js';
import { eventually, within } from '../support/wait.js';
import { parseExposition, sumOf, type MetricSample } from '../support/metrics-exposition.js';

// The Prometheus endpoint (config `metrics`), against a real server, a real client and the fake vLLM engine (a test
// double speaking vLLM's HTTP API). Figures are read from the exposition text as a scraper would.

/** The value of the one series of `name` whose labels include `labels`; undefined when there is none. */
function valueOf(samples: MetricSample[], name: string, labels: Record<string, string> = {}): number | undefined {
  const found = samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  if (found.length > 1) throw new Error(`${name} ${JSON.stringify(labels)}: ${found.length} series`);
  return found[0]?.value;
}


async function scrape(h: ServerHarness, headers: Record<string, string> = {}): Promise<MetricSample[]> {
  const res = await fetch(`http://${h.server.metrics!.address}/metrics`, { headers });
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return parseExposition(await res.text());
}

async function runTasks(h: ServerHarness, tasks: ReturnType<typeof mathTask>[]): Promise<Trajectory[]> {
  const session = h.client.openSession();
  for (const t of tasks) await session.submit(t);
  session.close();
  const got = await within(collect(session.trajectories()), 60_000, 'every trajectory delivered');
  return got;
}

describe('Prometheus metrics', () => {
  it('count trajectories by environment and status, with rewards, turns, tokens and phase times; engines and stages read when scraped', async () => {
    const h = await startServerHarness({ config: { metrics: { port: 0 }, run: { concurrency: 7 } } });
    try {
      const before = await scrape(h);
      expect(valueOf(before, 'rollout_trajectories_total')).toBeUndefined();
      const got = await runTasks(h, [mathTask('m1', 2, 3), mathTask('m2', 3, 4)]);
      expect(got).toHaveLength(5);
      const s = await scrape(h);
      const byStatus = new Map<string, number>();
      for (const t of got) {
        const status = TrajectoryStatus[t.status].replace(/^TRAJECTORY_STATUS_/, '').toLowerCase();
        byStatus.set(status, (byStatus.get(status) ?? 0) + 1);
      }
      for (const [status, n] of byStatus) expect(valueOf(s, 'rollout_trajectories_total', { environment: 'math', status })).toBe(n);
      expect(sumOf(s, 'rollout_trajectories_total')).toBe(5);
      const policyOutcomes = got.filter((t) => t.status === TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED || t.status === TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED);
      expect(policyOutcomes.length).toBeGreaterThan(0);
      expect(valueOf(s, 'rollout_reward_count', { environment: 'math' })).toBe(policyOutcomes.length);
      expect(valueOf(s, 'rollout_reward_sum', { environment: 'math' })).toBeCloseTo(policyOutcomes.reduce((a, t) => a + t.reward, 0), 6);
      expect(valueOf(s, 'rollout_trajectory_turns_sum', { environment: 'math' })).toBe(got.reduce((a, t) => a + t.numTurns, 0));
      expect(valueOf(s, 'rollout_trajectory_response_tokens_sum', { environment: 'math' })).toBe(got.reduce((a, t) => a + t.responseTokenIds.length, 0));
      expect(valueOf(s, 'rollout_trajectory_seconds_count', { environment: 'math', phase: 'total' })).toBe(5);
      expect(valueOf(s, 'rollout_trajectory_seconds_sum', { environment: 'math', phase: 'llm' })).toBeCloseTo(got.reduce((a, t) => a + t.timing!.llmMs, 0) / 1000, 6);
      // Read when scraped: the engine the pool holds, the stage pools as configured, nothing left in flight.
      const [backend] = h.server.pool.list();
      expect(valueOf(s, 'rollout_backend_max_concurrency', { backend: backend!.id })).toBe(256);
      expect(valueOf(s, 'rollout_backend_healthy', { backend: backend!.id })).toBe(1);
      expect(valueOf(s, 'rollout_backend_assigned_trajectories', { backend: backend!.id })).toBe(5);
      expect(valueOf(s, 'rollout_backend_inflight_requests', { backend: backend!.id })).toBe(0);
      expect(valueOf(s, 'rollout_stage_concurrency', { stage: 'run' })).toBe(7);
      expect(valueOf(s, 'rollout_samples_admitted')).toBe(0);
      expect(valueOf(s, 'rollout_samples_admission_capacity')).toBe(h.server.config.maxAdmitted);
      // The process: prom-client's defaults.
      expect(valueOf(s, 'process_cpu_user_seconds_total')).toBeGreaterThan(0);
      expect(valueOf(s, 'nodejs_eventloop_lag_p99_seconds')).toBeGreaterThanOrEqual(0);
      // An engine removed from the pool leaves the next scrape.
      await h.server.pool.remove(backend!.id, { drain: false });
      expect(valueOf(await scrape(h), 'rollout_backend_max_concurrency', { backend: backend!.id })).toBeUndefined();
    } finally {
      await h.close();
    }
  }, 120_000);

  it('count an infrastructure failure under its status, never as a reward', async () => {
    // No engine: the sample waits backendAcquireTimeoutMs for one, then ends BACKEND_ERROR.
    const h = await startServerHarness({ config: { metrics: { port: 0 }, backends: [], backendAcquireTimeoutMs: 200 } });
    try {
      const [t] = await runTasks(h, [mathTask('no-engine', 1, 5)]);
      expect(t!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_BACKEND_ERROR);
      const s = await scrape(h);
      expect(valueOf(s, 'rollout_trajectories_total', { environment: 'math', status: 'backend_error' })).toBe(1);
      expect(sumOf(s, 'rollout_reward_count')).toBe(0);
    } finally {
      await h.close();
    }
  }, 60_000);

  it('need the admin token when one is configured; answer nothing but GET /metrics', async () => {
    const h = await startServerHarness({ config: { metrics: { port: 0 }, auth: { adminToken: 'metrics-secret' } } });
    try {
      const url = `http://${h.server.metrics!.address}`;
      expect((await fetch(`${url}/metrics`)).status).toBe(401);
      expect((await fetch(`${url}/metrics`, { headers: { authorization: 'Bearer wrong' } })).status).toBe(401);
      expect(valueOf(await scrape(h, { authorization: 'Bearer metrics-secret' }), 'rollout_sessions')).toBe(0);
      expect((await fetch(`${url}/`)).status).toBe(404);
      expect((await fetch(`${url}/metrics`, { method: 'POST', headers: { authorization: 'Bearer metrics-secret' } })).status).toBe(405);
    } finally {
      await h.close();
    }
    const open = await startServerHarness({ config: { metrics: { port: 0, requireToken: false }, auth: { adminToken: 'metrics-secret' } } });
    try {
      expect(valueOf(await scrape(open), 'rollout_sessions')).toBe(0);
    } finally {
      await open.close();
    }
  }, 60_000);

  it('are off by default; a port in use fails the start naming metrics.port; shutdown closes the endpoint', async () => {
    const off = await startServerHarness();
    try {
      expect(off.server.metrics).toBeUndefined();
    } finally {
      await off.close();
    }
    const taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    const port = (taken.address() as { port: number }).port;
    try {
      const failed = await startServerHarness({ config: { metrics: { port } } }).then(
        async (h) => {
          await h.close();
          return undefined;
        },
        (err: unknown) => err,
      );
      expect(failed).toBeInstanceOf(RolloutError);
      expect((failed as RolloutError).code).toBe('failed_precondition');
      expect((failed as RolloutError).message).toContain('metrics.port');
    } finally {
      taken.close();
    }
    const h = await startServerHarness({ config: { metrics: { port: 0 } } });
    const url = `http://${h.server.metrics!.address}/metrics`;
    expect((await fetch(url)).status).toBe(200);
    await h.close();
    await expect(fetch(url)).rejects.toThrow();
  }, 60_000);
});

describe('rollout serve --metrics-port', () => {
  it('serves the metrics and prints their URL; SIGTERM closes them with the server', async () => {
    const serve = await spawnServe(['--fake-engine', '--metrics-port', '0']);
    try {
      await eventually(() => /metrics on (http:\S+)/.test(serve.output()), 'the metrics URL printed', 30_000);
      const url = /metrics on (http:\S+)/.exec(serve.output())![1]!;
      const res = await fetch(url);
      expect(res.status).toBe(200);
      const s = parseExposition(await res.text());
      expect(valueOf(s, 'rollout_sessions')).toBe(0);
      expect(s.some((x) => x.name === 'rollout_backend_max_concurrency')).toBe(true);
      serve.child.kill('SIGTERM');
      expect((await serve.exited).code).toBe(0);
      await expect(fetch(url)).rejects.toThrow();
    } finally {
      serve.kill();
    }
  }, 90_000);
});
