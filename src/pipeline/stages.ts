import { classifyThrown, RolloutError } from '../errors.js';
import type { RuntimeDeps } from '../runtime.js';
import { runAgentLoop } from './agent-loop.js';
import { jsonProblem } from '../environments/json.js';
import type { StageFns } from './pipeline.js';
import type { Sample } from './sample.js';
import { evalReserveMs, resolveSandboxSpec, type SandboxRequest } from '../sandboxes/spec.js';
import type { ToolTimeBudgetOptions } from '../tools/tool-time-budget.js';
import type { Sandbox } from '../sandboxes/types.js';
import type { OpenSandbox } from '../environments/types.js';
import { exceedsStaleness, staleness } from './staleness.js';
import type { ChatMessage } from '../tokens/types.js';

/**
 * The three stage functions. Failures are classified here by where they happen: the sandbox driver's are
 * sandbox errors, the environment's own code's are environment errors, the engines' are backend errors
 * (classified by the backend client). Aborts keep their reason (timeout or cancel).
 */
export function createStages(deps: RuntimeDeps): StageFns {
  const { config } = deps;
  const log = deps.logger.child({ component: 'stages' });
  const classify = (err: unknown, code: 'sandbox_error' | 'environment_error', signal: AbortSignal): RolloutError => classifyThrown(err, code, signal);
  /** When each sample's own sandbox reaches its wall clock (performance.now()), and that wall clock; set by init. */
  const sandboxClocks = new WeakMap<Sample, { endsAt: number; wallClockMs: number }>();

  /**
   * The episode's tool-time budget: `run.toolTimeShare` of the task's run timeout, the calls ending by whichever comes
   * first of the run stage's deadline less a margin (runMarginMs) and the sandbox's wall clock less the evaluation's
   * reserve (evalReserveMs). Whoever holds the clock when the episode's time runs out is what it is reported as: a tool
   * call of the model's (a `sleep`, an endless loop) is cut just before either deadline and the episode ends TRUNCATED
   * and evaluated, the policy's outcome; the engine (no answer by the run deadline) stays TIMEOUT. Called as the run
   * stage starts.
   */
  const toolTimeOf = (sample: Sample): ToolTimeBudgetOptions => {
    const { limits } = sample.task;
    const budgetMs = Math.max(1, Math.floor(limits.runTimeoutMs * config.run.toolTimeShare));
    const margin = runMarginMs(limits.runTimeoutMs);
    const runEnd = { budgetMs, endBy: performance.now() + limits.runTimeoutMs - margin, endByLabel: `the run stage's deadline (${limits.runTimeoutMs} ms) less its ${margin} ms margin` };
    const clock = sandboxClocks.get(sample);
    if (!clock) return runEnd;
    const reserve = evalReserveMs(clock.wallClockMs, limits.evalTimeoutMs);
    const sandboxEnd = clock.endsAt - reserve;
    if (sandboxEnd >= runEnd.endBy) return runEnd;
    return { budgetMs, endBy: sandboxEnd, endByLabel: `the sandbox's wall clock (${clock.wallClockMs} ms) less the evaluation's ${reserve} ms` };
  };

  /**
   * Environment.evaluate's `openSandbox` for one sample: resolved like the sample's own sandbox (the instance's
   * request by default, the wall clock bounded by what is left of the total timeout) and adopted by the sample, so
   * `release` stops it on any path; a start failure is a sandbox_error, an abandoned stage never leaks one.
   */
  const evalSandboxOpener = (sample: Sample, signal: AbortSignal): OpenSandbox => {
    return async (request?: SandboxRequest): Promise<Sandbox> => {
      const { environment, instance, limits } = sample.task;
      const left = Math.max(1, Math.floor(limits.totalTimeoutMs - (performance.now() - sample.submittedAt)));
      const spec = resolveSandboxSpec(config.sandbox, request ?? environment.sandbox?.(instance), left);
      let sandbox: Sandbox;
      try {
        sandbox = await deps.sandboxes.start(spec, signal);
      } catch (err) {
        throw classify(err, 'sandbox_error', signal);
      }
      if (!(await sample.adoptSandbox(sandbox)) || signal.aborted) throw RolloutError.from(signal.reason, 'cancelled');
      return sandbox;
    };
  };

  return {
    async init(sample, signal) {
      try {
        const { environment, instance, limits } = sample.task;
        // The wall clock is bounded by what is left of the total timeout (the sample ends there anyway), so the
        // tool-time budget's end (wall clock less the evaluation's reserve) also comes before the total deadline.
        const left = Math.max(1, Math.floor(limits.totalTimeoutMs - (performance.now() - sample.submittedAt)));
        const spec = resolveSandboxSpec(config.sandbox, environment.sandbox?.(instance), left);
        // Taken before the start: the sandbox's own clock starts later, so this deadline is never past the real one.
        sandboxClocks.set(sample, { endsAt: performance.now() + spec.limits.wallClockMs, wallClockMs: spec.limits.wallClockMs });
        const sandbox = await deps.sandboxes.start(spec, signal);
        // The stage may have been abandoned (timeout, cancel) while the sandbox was starting: never leak it.
        if (sample.finished || signal.aborted) {
          await sandbox.stop();
          throw RolloutError.from(signal.reason, 'cancelled');
        }
        sample.sandbox = sandbox;
      } catch (err) {
        throw classify(err, 'sandbox_error', signal);
      }
      let messages: unknown;
      try {
        ({ messages } = await sample.task.environment.init({ instance: sample.task.instance, sandbox: sample.sandbox, signal }));
      } catch (err) {
        throw classify(err, 'environment_error', signal);
      }
      // The environment's own answer, checked where it leaves the plugin: the token ledger refuses an empty conversation
      // as invalid_argument, which would fail the sample INVALID_TASK (the trainer's spec) for the environment's fault.
      const problem = messagesProblem(messages);
      if (problem !== undefined) throw new RolloutError('environment_error', `init returned ${problem}`);
      sample.initialMessages = messages as ChatMessage[];
    },

    async run(sample, signal) {
      const { limits } = sample.task;
      const restartable = limits.stalenessAction === 'restart' && sample.stalenessRestarts < config.maxStalenessRestarts;
      const run = await runAgentLoop(
        sample,
        { ...deps, maxContinuationsPerTurn: config.maxContinuationsPerTurn, maxToolCallsPerMessage: config.maxToolCallsPerMessage, stopWhenStale: restartable, toolTime: toolTimeOf(sample) },
        signal,
      );
      if (restartable && exceedsStaleness(limits, run.tokens)) {
        // Too stale to train on and the task asked for a fresh sample: run it again from init (bounded).
        sample.stalenessRestarts++;
        log.info(
          { sample: sample.key, staleness: staleness(run.tokens), maxStaleness: limits.maxStaleness, restart: sample.stalenessRestarts },
          'sample too stale; restarting it',
        );
        await sample.restart();
        return;
      }
      sample.run = run;
    },

    async eval(sample, signal) {
      const run = sample.run;
      const sandbox = sample.sandbox;
      if (!run || !sandbox) throw new RolloutError('internal', 'eval stage without a run result');
      const openSandbox = evalSandboxOpener(sample, signal);
      try {
        const evaluation = await sample.task.environment
          .evaluate({ instance: sample.task.instance, sandbox, signal, outcome: run.outcome, openSandbox })
          .finally(() => sample.stopExtraSandboxes());
        if (!Number.isFinite(evaluation.reward)) throw new RolloutError('environment_error', `reward is not a finite number: ${evaluation.reward}`);
        // What crosses to the trainer must be plain JSON and finite numbers: checked where it leaves the plugin.
        const problem = jsonProblem(evaluation.report, 'report') ?? detailsProblem(evaluation.details);
        if (problem) throw new RolloutError('environment_error', `evaluate returned an invalid ${problem}`);
        sample.evaluation = evaluation;
      } catch (err) {
        throw classify(err, 'environment_error', signal);
      }
    },
  };
}

const ROLES = new Set<unknown>(['system', 'user', 'assistant', 'tool']);

/** What is wrong with the first messages an environment's init returned (they must start a conversation), or undefined. */
function messagesProblem(messages: unknown): string | undefined {
  if (!Array.isArray(messages)) return `messages that are ${messages === null ? 'null' : typeof messages}, not an array`;
  if (messages.length === 0) return 'no first message (an empty messages array)';
  for (const [i, m] of messages.entries()) {
    const message = m as Partial<Record<keyof ChatMessage, unknown>> | null;
    if (typeof message !== 'object' || message === null || Array.isArray(message)) return `messages[${i}]: not a message object`;
    if (!ROLES.has(message.role)) return `messages[${i}].role: ${JSON.stringify(String(message.role)).slice(0, 40)} is not system, user, assistant or tool`;
    if (typeof message.content !== 'string') return `messages[${i}].content: not a string`;
    if (message.name !== undefined && typeof message.name !== 'string') return `messages[${i}].name: not a string`;
  }
  return undefined;
}

function detailsProblem(details: unknown): string | undefined {
  if (typeof details !== 'object' || details === null || Array.isArray(details)) return 'details: not an object of numbers';
  for (const [key, value] of Object.entries(details)) {
    if (typeof value !== 'number' || !Number.isFinite(value)) return `details.${key}: ${String(value)} is not a finite number`;
  }
  return undefined;
}

/**
 * How long before the run stage's deadline the model's tool calls are cut (see toolTimeOf): room for the cut command's
 * interrupt and the episode's end to reach the stage before its deadline does. 5% of the run timeout, at least 2 s and
 * at most 10 s, never more than half of it.
 */
export function runMarginMs(runTimeoutMs: number): number {
  return Math.min(Math.floor(runTimeoutMs / 2), Math.max(2_000, Math.min(10_000, Math.floor(runTimeoutMs / 20))));
}
