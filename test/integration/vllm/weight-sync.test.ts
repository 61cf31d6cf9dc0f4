import { Writable } from 'node:stream';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../../src/observability/logger.js';
import { PauseMode } from '../../../gen/ts/rollout/v1/backend.js';
import { Role, TrajectoryStatus, type Trajectory, type Turn } from '../../../gen/ts/rollout/v1/rollout.js';
import { TINY_QWEN3_DIR, VllmServer, vllmInstalled } from '../../../src/testing/vllm-server.js';
import { NullSandboxDriver } from '../../../src/testing/null-sandbox.js';
import { collect, invariantViolations, mathTask } from '../../support/harness.js';
import { recordingProxy, type Exchange, type RecordingProxy } from '../../support/recording-proxy.js';
import { startServerHarness, type ServerHarness } from '../../support/server-harness.js';

// Weight sync and failover end to end on two real vLLMs (the tiny random Qwen3 on CPU, dev mode: /pause?mode=,
// /resume), through the whole server: PauseGeneration / ResumeGeneration in the three modes while GRPO groups run,
// and kill -9 of one engine's process group mid-run. A recording proxy in front of each engine keeps every
// completion verbatim, so each sampled span of a trajectory is checked to be exactly one answer of the engine that
// produced it, to exactly the ledger's context before it. The random policy almost never samples <|im_end|>, so a
// math sample is one long turn cut by max_tokens (TRUNCATED): long enough for a pause to land inside it. Its tools
// never run, so the sandboxes are the no-op double (what is under test is the engines, not process spawning).
//
// Timing: a pause goes test -> gRPC -> server -> proxy -> vLLM, and on a loaded machine (CI's other test files share
// its two cores) that took longer than the tiny model needs for the rest of a 400-token turn (~1,300 tokens of a
// batch of four at ~300 tokens/s): turns ended before the pause landed, KEEP found nothing to freeze. The turns a
// pause must land inside are 1,500 tokens, so the same pause has ~4x the time; and what a test counts is read from
// the engine's own record (the proxy's exchanges), not from a moment the test assumes it caught. After each test the
// engine is resumed and idle again, so one failure cannot leave a paused engine to the next (a failover then hung
// for its whole budget).
const installed = vllmInstalled();
if (!installed && process.env.CI === 'true') throw new Error('CI=true but the real vLLM is not installed: run ./scripts/setup.sh');

const OK = [TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED];
const TOKEN = 'sync';
const TURN_TOKENS = 400;
/** Turns a pause must land inside (ABORT, KEEP): see the timing note above. */
const LONG_TURN_TOKENS = 1500;
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
const name = (t: Trajectory): string => `${t.taskId}#${t.sampleIndex} ${TrajectoryStatus[t.status]} ${t.finishReason} ${t.error}`;
const assistant = (t: Trajectory): Turn[] => t.turns.filter((x) => x.role === Role.ROLE_ASSISTANT);

/** A group of math samples, each one turn of up to `turnTokens` tokens. */
const group = (id: string, n: number, seed: number, turnTokens = TURN_TOKENS) =>
  // max_total_tokens counts the prompt too (~575 tokens with the math environment's tools).
  mathTask(id, n, seed, { sampling: { temperature: 1, seed, maxTokensPerTurn: turnTokens, maxTotalTokens: turnTokens + 1400, stop: [] } });

/** vLLM's count of tokens it has generated (GET /metrics, vllm:generation_tokens_total; updated every engine step). */
async function generatedTokens(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith('vllm:generation_tokens_total{'));
  return Number(line?.split(' ').at(-1) ?? NaN);
}

/** Each assistant span is one recorded answer (ids, logprobs) of its backend's engine to exactly the context before it. */
function expectVerbatim(t: Trajectory, exchangesOf: (backend: string) => readonly Exchange[]): void {
  const all = [...t.promptTokenIds, ...t.responseTokenIds];
  for (const span of assistant(t)) {
    const context = all.slice(0, t.promptTokenIds.length + span.start).join(',');
    const ids = t.responseTokenIds.slice(span.start, span.end);
    const match = exchangesOf(span.backend).find(
      (e) =>
        e.prompt.join(',') === context &&
        e.tokenIds.length === ids.length &&
        e.tokenIds.every((x, i) => x === ids[i]) &&
        e.logprobs.every((p, i) => Math.fround(p) === t.responseLogprobs[span.start + i]) &&
        e.finishReason === span.finishReason,
    );
    expect(match, `${name(t)}: span [${span.start}, ${span.end}) of ${span.backend} is one vLLM answer, verbatim`).toBeDefined();
  }
}

async function run(h: ServerHarness, tasks: ReturnType<typeof group>[]): Promise<{ done: Promise<Trajectory[]> }> {
  const session = h.client.openSession();
  for (const task of tasks) await session.submit(task);
  session.close();
  return { done: collect(session.trajectories()) };
}

describe.skipIf(!installed)('weight sync and failover end to end on two real vLLMs (tiny random Qwen3 on CPU)', () => {
  let vllmA: VllmServer;
  let vllmB: VllmServer;
  let proxyA: RecordingProxy;
  let proxyB: RecordingProxy;

  beforeAll(async () => {
    const started = Date.now();
    [vllmA, vllmB] = await Promise.all([
      VllmServer.start({ modelDir: TINY_QWEN3_DIR, servedModelName: 'tiny-qwen3', maxModelLen: 4096 }),
      VllmServer.start({ modelDir: TINY_QWEN3_DIR, servedModelName: 'tiny-qwen3', maxModelLen: 4096 }),
    ]);
    console.log(`two vLLMs started in ${Date.now() - started} ms`);
    [proxyA, proxyB] = await Promise.all([recordingProxy(vllmA.url), recordingProxy(vllmB.url)]);
    // An engine's first requests are slow (warm-up): without this, a pause soon after they start finds no token
    // sampled yet, and the turn is simply asked again whole.
    await Promise.all(
      [vllmA, vllmB].map(async (v) => {
        const res = await fetch(`${v.url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: v.model, prompt: [9707, 11, 1879], max_tokens: 8 }),
        });
        expect(res.status).toBe(200);
      }),
    );
  }, 600_000);

  afterAll(async () => {
    await Promise.all([proxyA?.close(), proxyB?.close()]);
    await Promise.all([vllmA?.close(), vllmB?.close()]);
  });

  describe('PauseGeneration / ResumeGeneration on one engine', () => {
    let h: ServerHarness;
    /** The version backend A serves now: each test bumps it from there, whatever an earlier test left. */
    const servedVersion = (): number => h.server.pool.list()[0]!.policyVersion;
    const exchanges = (): readonly Exchange[] => proxyA.exchanges;

    beforeAll(async () => {
      h = await startServerHarness({
        sandboxes: new NullSandboxDriver(),
        config: {
          model: vllmA.model,
          adminToken: TOKEN,
          backends: [{ url: proxyA.url, id: 'A', maxConcurrency: 8 }],
          backendRequestTimeoutMs: 240_000,
          backendAcquireTimeoutMs: 240_000,
        },
      });
    }, 120_000);
    afterAll(async () => h?.close());
    // A test that failed while the engine was paused must not leave it so: resume (no version change), then wait
    // until its trajectories have left the engine.
    afterEach(async () => {
      await h.client.resumeGeneration();
      await expect.poll(() => proxyA.inflight(), { timeout: 240_000 }).toBe(0);
    }, 300_000);

    /**
     * Until all `n` requests are at the engine and it has generated ~20 tokens for each since: they are then
     * decoding, far from their LONG_TURN_TOKENS, so a pause lands inside the turns (timing alone is not enough: the first
     * batches of a fresh engine take seconds to produce a token).
     */
    async function decoding(n = 4): Promise<void> {
      await expect.poll(() => proxyA.inflight(), { timeout: 120_000 }).toBe(n);
      const from = await generatedTokens(vllmA.url);
      await expect.poll(() => generatedTokens(vllmA.url), { timeout: 120_000, interval: 50 }).toBeGreaterThanOrEqual(from + 20 * n);
    }

    it('ABORT: each interrupted turn goes on after resume as a second span, v then v+1, both exactly what vLLM returned', async () => {
      const version = servedVersion();
      const start = proxyA.exchanges.length;
      const pending = await run(h, [group('abort-a', 4, 501, LONG_TURN_TOKENS)]);
      await decoding();
      const paused = await h.client.pauseGeneration(PauseMode.PAUSE_MODE_ABORT);
      expect(paused.map((b) => [b.id, b.paused])).toEqual([['A', true]]);
      // The aborted requests came back before the pause answered; nothing new reaches the engine while paused.
      expect(proxyA.inflight()).toBe(0);
      const seen = proxyA.exchanges.length;
      await sleep(500);
      expect(proxyA.exchanges.length).toBe(seen);
      await h.client.resumeGeneration({ policyVersion: version + 1 });
      const trajectories = await pending.done;
      expect(trajectories).toHaveLength(4);
      let splits = 0;
      for (const t of trajectories) {
        expect(OK, name(t)).toContain(t.status);
        expect(invariantViolations(t)).toEqual([]);
        expectVerbatim(t, exchanges);
        const spans = assistant(t);
        const cut = spans.findIndex((s) => s.continuesTurn);
        if (cut < 0) continue;
        splits++;
        expect(spans[cut - 1]).toMatchObject({ finishReason: 'abort', policyVersionStart: version, policyVersion: version });
        expect(spans[cut]).toMatchObject({ policyVersionStart: version + 1, policyVersion: version + 1 });
        expect(spans[cut - 1]!.end).toBe(spans[cut]!.start);
        // The continuation asked for the rest of the turn's budget only.
        const rest = exchanges().find((e) => e.prompt.length === t.promptTokenIds.length + spans[cut]!.start && e.tokenIds.length === spans[cut]!.end - spans[cut]!.start);
        expect(rest?.maxTokens).toBe(LONG_TURN_TOKENS - (spans[cut - 1]!.end - spans[cut - 1]!.start));
        expect([t.policyVersionMin, t.policyVersionMax]).toEqual([version, version + 1]);
      }
      // Every turn vLLM aborted went on as a second span, and the pause landed inside turns (see decoding(): with
      // 1,500-token turns, all four).
      const aborted = proxyA.exchanges.slice(start).filter((e) => e.finishReason === 'abort').length;
      expect(splits, 'turns split by the pause').toBe(aborted);
      expect(aborted, 'turns vLLM aborted').toBeGreaterThan(0);
      const sizes = trajectories.map((t) => assistant(t).map((s) => s.end - s.start).join('+'));
      console.log(`ABORT on vLLM: ${splits}/4 turns split; tokens per segment: ${sizes.join(', ')}`);
    }, 300_000);

    it('WAIT: answers once the requests in flight have finished (none aborted); requests held meanwhile run with the new version', async () => {
      const version = servedVersion();
      const firstAnswers = proxyA.exchanges.length;
      const first = await run(h, [group('wait-a', 4, 502)]);
      try {
        await expect.poll(() => proxyA.inflight(), { timeout: 120_000 }).toBe(4);
      } catch (err) {
        console.log('diagnosis:', JSON.stringify({ stats: h.server.pool.stats(), list: h.server.pool.list(), stages: h.server.runtime.pipeline.stageStats(), inflight: proxyA.inflight() }));
        throw err;
      }
      await h.client.pauseGeneration(PauseMode.PAUSE_MODE_WAIT);
      // All four first-batch turns were answered before the pause answered.
      expect(proxyA.inflight()).toBe(0);
      expect(proxyA.exchanges.length - firstAnswers).toBe(4);
      const second = await run(h, [group('wait-b', 2, 503)]);
      await sleep(500);
      expect(proxyA.exchanges.length - firstAnswers).toBe(4); // held in the server, not sent
      await h.client.resumeGeneration({ policyVersion: version + 1 });
      const [a, b] = [await first.done, await second.done];
      for (const t of [...a, ...b]) {
        expect(OK, name(t)).toContain(t.status);
        expect(invariantViolations(t)).toEqual([]);
        expectVerbatim(t, exchanges);
        for (const span of assistant(t)) {
          expect(span.continuesTurn).toBe(false);
          expect(span.finishReason).not.toBe('abort');
          expect(span.policyVersionStart).toBe(span.policyVersion);
          expect(span.policyVersion).toBe(t.taskId === 'wait-a' ? version : version + 1);
        }
      }
    }, 300_000);

    it('KEEP: requests freeze in vLLM and finish after resume, each turn recorded as spanning v → v+1', async () => {
      const version = servedVersion();
      const pending = await run(h, [group('keep-a', 4, 504, LONG_TURN_TOKENS)]);
      await decoding();
      await h.client.pauseGeneration(PauseMode.PAUSE_MODE_KEEP);
      // An answer vLLM finished just before the pause may still be on its way through the proxy when the pause
      // answers; let those land, then nothing may move: no answer, no new request, not one token generated.
      const snapshot = async () => [proxyA.inflight(), proxyA.exchanges.length, await generatedTokens(vllmA.url)];
      let before = await snapshot();
      let settled = false;
      for (let i = 0; i < 40 && !settled; i++) {
        await sleep(250);
        const now = await snapshot();
        settled = now.every((v, j) => v === before[j]);
        before = now;
      }
      expect(settled, 'the paused engine kept answering or generating for 10 s').toBe(true);
      const frozen = before[0]!;
      expect(frozen).toBeGreaterThan(0);
      await sleep(1_000);
      expect(await snapshot()).toEqual(before); // still in flight, none answered, vLLM idle
      await h.client.resumeGeneration({ policyVersion: version + 1 });
      const trajectories = await pending.done;
      let mixed = 0;
      for (const t of trajectories) {
        expect(OK, name(t)).toContain(t.status);
        expect(invariantViolations(t)).toEqual([]);
        expectVerbatim(t, exchanges);
        for (const span of assistant(t)) {
          expect(span.continuesTurn).toBe(false);
          expect(span.finishReason).not.toBe('abort');
          if (span.policyVersionStart === span.policyVersion) continue;
          mixed++;
          expect([span.policyVersionStart, span.policyVersion]).toEqual([version, version + 1]);
          expect([t.policyVersionMin, t.policyVersionMax]).toEqual([version, version + 1]);
        }
      }
      expect(mixed).toBeGreaterThanOrEqual(frozen);
    }, 300_000);
  });

  describe('failover', () => {
    let h: ServerHarness;
    /** The server's log lines (info and up), quoted when a wait fails so a failure in CI says what the server saw. */
    const serverLog: string[] = [];
    beforeAll(async () => {
      const destination = new Writable({
        write(chunk: Buffer, _encoding, done) {
          serverLog.push(...chunk.toString().split('\n').filter(Boolean));
          if (serverLog.length > 400) serverLog.splice(0, serverLog.length - 400);
          done();
        },
      });
      h = await startServerHarness({
        logger: createLogger({ level: 'info', destination }),
        sandboxes: new NullSandboxDriver(),
        config: {
          model: vllmA.model,
          adminToken: TOKEN,
          backends: [
            { url: proxyA.url, id: 'A', maxConcurrency: 4 },
            { url: proxyB.url, id: 'B', maxConcurrency: 4 },
          ],
          backendRequestTimeoutMs: 240_000,
          backendAcquireTimeoutMs: 240_000,
        },
      });
    }, 120_000);
    afterAll(async () => h?.close());

    it('kill -9 of one engine mid-run: its trajectories finish on the other, ids exactly what the survivor returned; none hangs', async () => {
      const before = { A: proxyA.exchanges.length, B: proxyB.exchanges.length };
      const pending = await run(h, [group('killed-a', 4, 601), group('killed-b', 4, 602)]);
      const state = (): string =>
        `in flight A ${proxyA.inflight()}, B ${proxyB.inflight()}; pool ${JSON.stringify(h.server.pool.list().map((b) => ({ id: b.id, healthy: b.healthy, trajectories: b.inflightTrajectories, requests: b.inflightRequests })))}\n${serverLog.slice(-60).join('\n')}`;
      // Both engines decoding (B's requests are what the kill must catch), then B well into its answers.
      const saying = async (wait: Promise<unknown>): Promise<void> => {
        try {
          await wait;
        } catch (err) {
          throw new Error(`${(err as Error).message}\n${state()}`, { cause: err });
        }
      };
      await saying(expect.poll(() => proxyA.inflight() > 0 && proxyB.inflight() > 0, { timeout: 120_000 }).toBe(true));
      const from = await generatedTokens(vllmB.url);
      await saying(expect.poll(() => generatedTokens(vllmB.url), { timeout: 120_000, interval: 50 }).toBeGreaterThanOrEqual(from + 80));
      const onB = proxyB.inflight();
      const killedAt = Date.now();
      process.kill(-vllmB.pid!, 'SIGKILL');
      const trajectories = await pending.done;
      console.log(`failover on vLLM: ${onB} requests in flight on B at kill -9; all 8 trajectories done ${Date.now() - killedAt} ms later`);
      expect(trajectories).toHaveLength(8);
      const byBackend = { A: proxyA.exchanges.slice(before.A), B: proxyB.exchanges.slice(before.B) };
      for (const t of trajectories) {
        expect(OK, name(t)).toContain(t.status);
        expect(invariantViolations(t)).toEqual([]);
        expectVerbatim(t, (backend) => byBackend[backend as 'A' | 'B']);
      }
      // The trajectories that were decoding on B when it died were sampled again, whole, by A.
      expect(trajectories.filter((t) => assistant(t).every((s) => s.backend === 'A')).length).toBeGreaterThanOrEqual(onB);
      const backends = await h.client.listBackends();
      expect(backends.map((b) => [b.id, b.healthy])).toEqual([['A', true], ['B', false]]);
      expect(h.server.pool.stats().failovers).toBeGreaterThanOrEqual(onB);
    }, 300_000);
  });
});
