import { createServer, request, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LogprobsMode } from '../../../gen/ts/rollout/v1/backend.js';
import { Role, TrajectoryStatus, type Trajectory } from '../../../gen/ts/rollout/v1/rollout.js';
import { TINY_QWEN3_DIR, VllmServer, vllmInstalled } from '../../../src/testing/vllm-server.js';
import { collect, invariantViolations, mathTask } from '../../support/harness.js';
import { startServerHarness, type ServerHarness } from '../../support/server-harness.js';

// The whole server end to end on a real vLLM (tiny random-weight Qwen3 on CPU). The policy writes random text, so
// math samples end by the token budget: what is checked is that GRPO groups finish with a policy status (never an
// infrastructure error) and that every sampled id and logprob in a trajectory is exactly what vLLM answered, as
// recorded by an HTTP proxy between the server and the engine. One engine for the file.
const installed = vllmInstalled();
if (!installed && process.env.CI === 'true') throw new Error('CI=true but the real vLLM is not installed: run ./scripts/setup.sh');

/** One /v1/completions exchange as it crossed the wire. */
interface Exchange {
  prompt: number[];
  seed: number | undefined;
  tokenIds: number[];
  logprobs: number[];
}

/** A node:http proxy in front of the engine that records every completion request and vLLM's answer verbatim. */
async function recordingProxy(target: string): Promise<{ url: string; exchanges: Exchange[]; server: Server }> {
  const exchanges: Exchange[] = [];
  const upstream = new URL(target);
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const out = request(
        { host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers: req.headers },
        (answer) => {
          const parts: Buffer[] = [];
          answer.on('data', (c: Buffer) => parts.push(c));
          answer.on('end', () => {
            const text = Buffer.concat(parts);
            if (req.url === '/v1/completions' && answer.statusCode === 200) {
              const sent = JSON.parse(body.toString('utf8')) as { prompt: number[]; seed?: number };
              const choice = (JSON.parse(text.toString('utf8')) as { choices: Array<{ logprobs: { tokens: string[]; token_logprobs: number[] } }> }).choices[0]!;
              // The client asks for return_tokens_as_token_ids: each sampled token is "token_id:<id>".
              const tokenIds = choice.logprobs.tokens.map((t) => Number(/^token_id:(\d+)$/.exec(t)?.[1] ?? NaN));
              exchanges.push({ prompt: sent.prompt, seed: sent.seed, tokenIds, logprobs: choice.logprobs.token_logprobs });
            }
            res.writeHead(answer.statusCode ?? 502, answer.headers).end(text);
          });
        },
      );
      out.on('error', () => res.destroy());
      out.end(body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, exchanges, server };
}

const POLICY_STATUSES = [TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED];

describe.skipIf(!installed)('the rollout server end to end on a real vLLM (tiny random Qwen3 on CPU)', () => {
  let vllm: VllmServer;
  let proxy: Awaited<ReturnType<typeof recordingProxy>>;
  let h: ServerHarness;

  beforeAll(async () => {
    vllm = await VllmServer.start({ modelDir: TINY_QWEN3_DIR, servedModelName: 'tiny-qwen3', maxModelLen: 2048 });
    proxy = await recordingProxy(vllm.url);
    h = await startServerHarness({
      config: { model: vllm.model, backends: [{ url: proxy.url, maxConcurrency: 8 }], backendRequestTimeoutMs: 240_000, backendAcquireTimeoutMs: 240_000 },
    });
  }, 360_000);

  afterAll(async () => {
    await h?.close();
    proxy?.server.close();
    await vllm?.close();
  });

  /** Runs tasks on one stream and returns their trajectories. */
  async function run(tasks: ReturnType<typeof mathTask>[]): Promise<Trajectory[]> {
    const session = h.client.openSession();
    for (const task of tasks) await session.submit(task);
    session.close();
    return collect(session.trajectories());
  }

  /** Each assistant turn's ids and logprobs are one recorded vLLM answer to exactly the ledger's ids before it. */
  function expectVerbatim(t: Trajectory): number {
    const all = [...t.promptTokenIds, ...t.responseTokenIds];
    let turns = 0;
    for (const turn of t.turns.filter((x) => x.role === Role.ROLE_ASSISTANT)) {
      turns++;
      const context = all.slice(0, t.promptTokenIds.length + turn.start).join(',');
      const ids = t.responseTokenIds.slice(turn.start, turn.end);
      const logprobs = t.responseLogprobs.slice(turn.start, turn.end);
      const answers = proxy.exchanges.filter((e) => e.prompt.join(',') === context);
      expect(answers.length, `an engine request with the ledger's context for ${t.taskId}#${t.sampleIndex} turn at ${turn.start}`).toBeGreaterThan(0);
      const match = answers.filter(
        (e) => e.tokenIds.length === ids.length && e.tokenIds.every((x, i) => x === ids[i]) && e.logprobs.every((x, i) => Math.fround(x) === logprobs[i]),
      );
      expect(match.length, `vLLM's ids and logprobs verbatim for ${t.taskId}#${t.sampleIndex} turn at ${turn.start}`).toBeGreaterThan(0);
    }
    return turns;
  }

  it('finishes GRPO groups of math tasks with policy statuses, every sampled id and logprob exactly as vLLM returned it', async () => {
    const tasks = [0, 1].map((k) =>
      mathTask(`vllm-math-${k}`, 4, 100 + k, {
        sampling: { temperature: 1, seed: 100 + k, maxTokensPerTurn: 48, maxTotalTokens: 1024, stop: [] },
      }),
    );
    const trajectories = await run(tasks);
    expect(trajectories).toHaveLength(8);
    let assistantTurns = 0;
    for (const t of trajectories) {
      expect(POLICY_STATUSES, `${t.taskId}#${t.sampleIndex}: ${TrajectoryStatus[t.status]} ${t.error}`).toContain(t.status);
      expect(invariantViolations(t)).toEqual([]);
      expect(t.responseTokenIds.length).toBeGreaterThan(0);
      expect(t.logprobsMode, 'learned from /server_info (vllm-server.ts runs processed_logprobs)').toBe(LogprobsMode.LOGPROBS_MODE_PROCESSED);
      assistantTurns += expectVerbatim(t);
    }
    expect(assistantTurns).toBeGreaterThanOrEqual(8);
    // A group's samples share the prompt and differ by seed, so the random policy wrote different answers.
    for (const k of [0, 1]) {
      const group = trajectories.filter((t) => t.taskId === `vllm-math-${k}`);
      expect(new Set(group.map((t) => t.responseTokenIds.slice(0, 48).join(','))).size).toBe(4);
    }
  });
});
