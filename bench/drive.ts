import type { RolloutClient, RolloutSession, TaskInput } from '../src/client/rollout-client.js';
import { VllmClient } from '../src/backends/vllm-client.js';
import { makeMathProblem } from '../src/testing/arithmetic.js';
import type { Trajectory } from '../gen/ts/rollout/v1/rollout.js';
import { statusName } from '../src/pipeline/outcome.js';
import type { RecordedRequest } from './engine-child.js';
import { startProgress } from './progress.js';

/** One load on the server: `trajectories` samples in tasks of `groupSize`, at most `concurrency` in flight. */
export interface DriveOptions {
  label: string;
  /** Task id prefix; unique per server. */
  prefix: string;
  environment: string;
  trajectories: number;
  concurrency: number;
  groupSize: number;
  seed: number;
  timeoutMs: number;
  /** Updated as the pass runs (trajectories submitted and received), for a sampler to read. */
  live?: LiveCounts;
  /** Builds each task (default: {@link benchTask}, one arithmetic problem). */
  task?: (taskId: string, environment: string, numSamples: number, seed: number) => TaskInput;
}

export interface LiveCounts {
  submitted: number;
  received: number;
}

export interface DriveResult {
  trajectories: number;
  wallMs: number;
  turns: number;
  /** Client-observed, from the task's submit to the trajectory's arrival, per trajectory. */
  latenciesMs: number[];
  /** From submit to the server's `accepted` (validated and admitted), per task. */
  acceptMs: number[];
  /** The server's own timing.totalMs per trajectory (from admission to the trajectory being handed to the stream). */
  serverTotalMs: number[];
  statuses: Record<string, number>;
  meanReward: number;
  rejected: string[];
  /** The error text of the first few trajectories that did not complete (status: error), to say why. */
  errors: string[];
}

/** Re-exported for the other benches (soak, memory). */
export { statusName };

/** A math-shaped task (the calc double grades like math), one arithmetic problem per task. */
export function benchTask(taskId: string, environment: string, numSamples: number, seed: number): TaskInput {
  const problem = makeMathProblem(seed);
  return {
    taskId,
    environment,
    numSamples,
    instance: { problem: problem.question, answer: String(problem.answer) },
    sampling: { temperature: 1, seed, maxTokensPerTurn: 256, maxTotalTokens: 4_096, stop: [] },
  };
}

/**
 * Streams the load through one Rollout session, client-side windowed: a new task is submitted as soon as its
 * samples fit under `concurrency`, so the server holds that many trajectories from start to (almost) end.
 * Wall time runs from the first submit to the last trajectory.
 */
export async function driveServer(client: RolloutClient, o: DriveOptions): Promise<DriveResult> {
  const session = client.openSession({ sessionId: `${o.prefix}-session` });
  await session.opened;
  const tasks = Math.ceil(o.trajectories / o.groupSize);
  const sizeOf = (i: number): number => Math.min(o.groupSize, o.trajectories - i * o.groupSize);
  const submittedAt = new Map<string, number>();
  const rejected: string[] = [];
  const result: DriveResult = { trajectories: 0, wallMs: 0, turns: 0, latenciesMs: [], acceptMs: [], serverTotalMs: [], statuses: {}, meanReward: 0, rejected, errors: [] };
  let nextTask = 0;
  let inflight = 0;
  const submitMore = (s: RolloutSession): void => {
    while (nextTask < tasks && (inflight === 0 || inflight + sizeOf(nextTask) <= o.concurrency)) {
      const n = sizeOf(nextTask);
      const taskId = `${o.prefix}-${nextTask}`;
      inflight += n;
      if (o.live) o.live.submitted += n;
      submittedAt.set(taskId, performance.now());
      const at = performance.now();
      s.submit((o.task ?? benchTask)(taskId, o.environment, n, o.seed + nextTask)).then(() => void result.acceptMs.push(performance.now() - at), (err: unknown) => {
        rejected.push(`${taskId}: ${err instanceof Error ? err.message : String(err)}`);
        inflight -= n;
        submitMore(s);
      });
      nextTask++;
      if (nextTask === tasks) s.close();
    }
  };

  const progress = startProgress(o.label, o.trajectories);
  const watchdog = setTimeout(() => session.abort(), o.timeoutMs);
  let rewardSum = 0;
  const started = performance.now();
  try {
    submitMore(session);
    for await (const t of session.trajectories()) {
      record(result, t, performance.now() - (submittedAt.get(t.taskId) ?? started));
      rewardSum += t.reward;
      inflight--;
      if (o.live) o.live.received++;
      progress.update(result.trajectories);
      submitMore(session);
    }
  } catch (err) {
    throw new Error(`${o.label}: stream failed after ${result.trajectories}/${o.trajectories} trajectories` +
      `${performance.now() - started >= o.timeoutMs ? ` (timeout ${o.timeoutMs} ms)` : ''}`, { cause: err });
  } finally {
    clearTimeout(watchdog);
    progress.stop();
  }
  result.wallMs = performance.now() - started;
  result.meanReward = result.trajectories > 0 ? rewardSum / result.trajectories : 0;
  return result;
}

function record(result: DriveResult, t: Trajectory, latencyMs: number): void {
  result.trajectories++;
  result.turns += t.numTurns;
  result.latenciesMs.push(latencyMs);
  result.serverTotalMs.push(t.timing?.totalMs ?? 0);
  const status = statusName(t.status);
  result.statuses[status] = (result.statuses[status] ?? 0) + 1;
  if (t.error && result.errors.length < 5) result.errors.push(`${status}: ${t.error}`);
}

export interface ReplayResult {
  requests: number;
  wallMs: number;
  latenciesMs: number[];
  promptTokens: number;
  completionTokens: number;
  errors: number;
  firstError: string | undefined;
}

/**
 * Sends recorded completion requests straight to the engine with the server's own engine client (VllmClient),
 * `concurrency` at a time, each with its own AbortSignal like a trajectory's: the engine-bound limit the server
 * is compared with.
 */
export async function replayDirect(url: string, model: string, requests: readonly RecordedRequest[], concurrency: number, label: string): Promise<ReplayResult> {
  const client = new VllmClient({ url, model });
  const latencies = new Array<number>(requests.length).fill(0);
  const progress = startProgress(label, requests.length);
  let next = 0;
  let done = 0;
  let completionTokens = 0;
  let errors = 0;
  let firstError: string | undefined;
  const worker = async (): Promise<void> => {
    while (next < requests.length) {
      const i = next++;
      const r = requests[i]!;
      const t0 = performance.now();
      try {
        const out = await client.generate({
          promptIds: r.prompt,
          maxTokens: r.max_tokens,
          ...(r.temperature !== undefined && { temperature: r.temperature }),
          ...(r.top_p !== undefined && { topP: r.top_p }),
          ...(r.top_k !== undefined && { topK: r.top_k }),
          ...(r.seed !== undefined && { seed: r.seed }),
          ...(r.stop !== undefined && { stop: r.stop }),
          signal: new AbortController().signal,
        });
        completionTokens += out.tokenIds.length;
      } catch (err) {
        errors++;
        firstError ??= err instanceof Error ? err.message : String(err);
      }
      latencies[i] = performance.now() - t0;
      progress.update(++done);
    }
  };
  const started = performance.now();
  try {
    await Promise.all(Array.from({ length: Math.min(concurrency, requests.length) }, worker));
  } finally {
    progress.stop();
  }
  const promptTokens = requests.reduce((sum, r) => sum + r.prompt.length, 0);
  return { requests: requests.length, wallMs: performance.now() - started, latenciesMs: latencies, promptTokens, completionTokens, errors, firstError };
}

/** Nearest-rank percentile (p in [0, 100]) of unsorted values; 0 for none. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}
