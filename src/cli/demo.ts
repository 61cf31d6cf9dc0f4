import cliProgress from 'cli-progress';
import { existsSync } from 'node:fs';
import { startRolloutServer, type RolloutServer } from '../app.js';
import { RolloutClient } from '../client/rollout-client.js';
import { createLogger } from '../observability/logger.js';
import { TINY_QWEN3_URL } from '../backends/embedded/embedded-url.js';
import { LogprobsMode } from '../../gen/ts/rollout/v1/backend.js';
import { FakeVllmEngine } from '../testing/fake-vllm.js';
import { createScriptedMathPolicy, type FakePolicy } from '../testing/scripted-policy.js';
import { defaultImagePath } from '../sandboxes/images/image-recipe.js';
import { makeMathProblem } from '../testing/arithmetic.js';
import { loadQwen3 } from '../tokens/tokenizer.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { statusName } from '../pipeline/outcome.js';
import { forTerminal } from './terminal-text.js';
import { ignoreGoneTerminal, signalExitCode, StopSignals } from './stop-signals.js';

export interface DemoOptions {
  groups: number;
  groupSize: number;
  latencyMs: number;
  seed: number;
  messages?: boolean;
  /** Sandbox image (.sif or directory); default the project's image when scripts/setup.sh has built it. */
  image?: string;
  /**
   * `fake` (default): the fake vLLM engine with a scripted agent that solves the problems. `embedded`: llama.cpp
   * in-process running the tiny random-weight Qwen3, which writes random text — trajectories end COMPLETED or
   * TRUNCATED unrewarded; what it shows is the whole path (real sampling, logprobs) without a GPU server.
   */
  engine?: 'fake' | 'embedded';
}

/**
 * SIGINT, SIGTERM and SIGHUP (the terminal closed, the ssh session dropped) during the demo: the first stops it — the
 * client's stream is dropped, and runDemo's cleanup shuts the server down (its sandboxes, their cgroups and the
 * image's squashfuse mount released) and closes the engine before the process exits with 128 + the signal's number;
 * a second signal (but a repeated SIGHUP) exits at once, cleanup or not (see {@link StopSignals}).
 * Without it Ctrl-C killed node mid-run and left the image mounted and the sandboxes' cgroups behind.
 */
class DemoInterrupt {
  readonly #controller = new AbortController();
  readonly #signals = new StopSignals(
    (name) => {
      console.error(`\ndemo: ${name}: stopping — releasing the sandboxes and the engine (${name} again to exit at once)`);
      this.#controller.abort();
    },
    (name) => {
      console.error(`demo: ${name} again: exiting without finishing the cleanup`);
      process.exit(signalExitCode(name));
    },
  );

  /** Fires on the first signal. */
  get aborted(): AbortSignal {
    return this.#controller.signal;
  }

  /** The exit code the signal asks for, once one came. */
  get exitCode(): number | undefined {
    return this.#signals.exitCode;
  }

  dispose(): void {
    this.#signals.dispose();
  }
}

/**
 * `rollout demo`: starts the fake vLLM engine (test double), a server with bubblewrap sandboxes on a free
 * port, and a client that submits GRPO groups of math problems and prints each trajectory as it streams in.
 * Returns the exit code: 0 when every trajectory arrived and none was an infrastructure failure; 130 (143, 129) when
 * SIGINT (SIGTERM, SIGHUP) stopped it, after everything it started was released (see {@link DemoInterrupt}). What
 * the model and the tools wrote is printed with control characters escaped (see forTerminal).
 */
export async function runDemo(opts: DemoOptions, inject: DemoInject = {}): Promise<number> {
  // For the rest of the process's life, not the demo's: the error of the last line written arrives after it returned.
  ignoreGoneTerminal();
  const interrupt = new DemoInterrupt();
  try {
    return await demo(opts, interrupt, inject);
  } finally {
    interrupt.dispose();
  }
}

/** The seam tests use to run this very command with a policy of their own (a test double; never set by the CLI). */
export interface DemoInject {
  /** The fake engine's policy instead of the scripted math agent. */
  policy?: FakePolicy;
}

async function demo(opts: DemoOptions, interrupt: DemoInterrupt, inject: DemoInject): Promise<number> {
  const logger = createLogger({ level: process.env.ROLLOUT_LOG_LEVEL ?? 'warn' });
  const { tokenizer } = await loadQwen3();
  const image = opts.image ?? (existsSync(defaultImagePath()) ? defaultImagePath() : undefined);
  const sandbox = { ...(image !== undefined && { image }) };
  if (interrupt.exitCode !== undefined) return interrupt.exitCode;
  // The scripted agent computes through python or bash (half each), both running in the sandbox image.
  const engine =
    opts.engine === 'embedded'
      ? undefined
      : await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: opts.latencyMs, policy: inject.policy ?? createScriptedMathPolicy({ bashRate: 0.5 }) });
  const backends = engine ? [{ url: engine.url }] : [{ kind: 'embedded' as const, url: `${TINY_QWEN3_URL}?sequences=2`, maxConcurrency: 2 }];
  let server: RolloutServer;
  try {
    server = await startRolloutServer({ port: 0, model: engine?.model ?? 'tiny-qwen3', backends, sandbox }, { logger });
  } catch (err) {
    await engine?.close();
    throw err;
  }
  const client = new RolloutClient(server.address);
  const total = opts.groups * opts.groupSize;
  console.log(`demo: server ${server.address}, ${engine ? `fake vLLM engine ${engine.url}` : `embedded llama.cpp engine ${TINY_QWEN3_URL} (random weights)`}, ${opts.groups} groups × ${opts.groupSize} samples`);
  console.log(`demo: sandboxes from ${image ?? "the host's /usr (no image built: run scripts/setup.sh)"}`);
  const bar = process.stderr.isTTY
    ? new cliProgress.SingleBar({ format: 'trajectories {bar} {value}/{total} | {eta_formatted} left', stream: process.stderr, hideCursor: true }, cliProgress.Presets.shades_classic)
    : undefined;
  const started = performance.now();
  const received: Trajectory[] = [];
  try {
    if (interrupt.aborted.aborted) return interrupt.exitCode!;
    const session = client.openSession({ sessionId: `demo-${opts.seed}` });
    // A signal drops the stream: the submits and the loop below end with its error, and the cleanup runs.
    const onInterrupt = (): void => session.abort();
    interrupt.aborted.addEventListener('abort', onInterrupt, { once: true });
    await session.opened;
    for (let g = 0; g < opts.groups; g++) {
      const problem = makeMathProblem(opts.seed * 1_000 + g);
      await session.submit({
        taskId: `demo-${g}`,
        groupId: `group-${g}`,
        environment: 'math',
        numSamples: opts.groupSize,
        instance: { problem: problem.question, answer: String(problem.answer) },
        sampling: { temperature: 1, seed: opts.seed * 1_000 + g, maxTokensPerTurn: 256, maxTotalTokens: 4_096, stop: [] },
        includeMessages: opts.messages ?? false,
      });
    }
    session.close();
    bar?.start(total, 0);
    for await (const t of session.trajectories()) {
      received.push(t);
      const line =
        `[${String(received.length).padStart(String(total).length)}/${total}] ${t.taskId}#${t.sampleIndex} ${statusName(t.status).padEnd(9)} ` +
        `reward ${t.reward.toFixed(1)}  turns ${t.numTurns}  tokens ${t.promptTokenIds.length}+${t.responseTokenIds.length}  ` +
        `logprobs ${LogprobsMode[t.logprobsMode].replace('LOGPROBS_MODE_', '').replace('UNSPECIFIED', 'unknown').toLowerCase()}  ` +
        `${Math.round(t.timing?.totalMs ?? 0)} ms  ${t.finishReason}${t.error ? `  (${t.error})` : ''}`;
      if (bar) {
        bar.update(received.length);
        process.stderr.write('\r\x1b[2K');
      }
      // What the engine, the policy and the tools wrote is shown, never obeyed (an escape sequence in a tool's output).
      console.log(forTerminal(line));
      if (opts.messages && received.length === 1) for (const m of t.messages) console.log(`    ${forTerminal(m.role)}: ${forTerminal(m.content).replace(/\n/g, '\n      ')}`);
    }
    interrupt.aborted.removeEventListener('abort', onInterrupt);
  } catch (err) {
    // The stream the signal dropped (CANCELLED) is how an interrupted demo ends, not an error.
    if (interrupt.exitCode === undefined) throw err;
  } finally {
    bar?.stop();
    client.close();
    await server.shutdown();
    await engine?.close();
  }
  if (interrupt.exitCode !== undefined) {
    console.error(`demo: stopped by a signal after ${received.length}/${total} trajectories; sandboxes and engine released`);
    return interrupt.exitCode;
  }
  const seconds = (performance.now() - started) / 1000;
  const infra = received.filter((t) => t.status !== TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED && t.status !== TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED);
  const groups = new Map<string, number[]>();
  for (const t of received) groups.set(t.groupId, [...(groups.get(t.groupId) ?? []), t.reward]);
  console.log(`\n${received.length}/${total} trajectories in ${seconds.toFixed(1)} s (${(received.length / seconds).toFixed(1)}/s); ${infra.length} infrastructure failures`);
  for (const [group, rewards] of groups) console.log(`  ${group}: mean reward ${(rewards.reduce((a, b) => a + b, 0) / rewards.length).toFixed(2)} over ${rewards.length}`);
  return received.length === total && infra.length === 0 ? 0 : 1;
}
