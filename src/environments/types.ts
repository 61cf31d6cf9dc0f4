import type { ChatMessage } from '../tokens/types.js';
import type { Sandbox } from '../sandboxes/types.js';
import type { Tool } from '../tools/types.js';
import type { JsonObject } from './json.js';
import type { SandboxRequest } from '../sandboxes/spec.js';

export interface EnvironmentContext<I> {
  instance: I;
  /** The sample's sandbox (environments that need none still get one; the pipeline owns its life). */
  sandbox: Sandbox;
  signal: AbortSignal;
}

export interface EpisodeOutcome {
  /** The whole conversation, assistant turns decoded from the sampled ids. */
  messages: readonly ChatMessage[];
  /** Answer passed to the finish tool, if it was called. */
  finishAnswer?: string;
  /** Why the run ended: 'finish_tool', 'answer', 'max_turns', 'max_total_tokens', 'tool_time_budget' (and others). */
  finishReason: string;
}

/**
 * Opens an extra sandbox for evaluation, e.g. a fresh one from the same image so a test suite runs on a clean
 * checkout instead of whatever the agent left behind. `request` defaults to what `Environment.sandbox` asks for
 * this instance; the server fills the rest from its config exactly as for the sample's own sandbox (limits, no
 * network unless asked), with the wall clock bounded by what is left of the task's total timeout.
 *
 * The pipeline owns its life: it is stopped when `evaluate` settles, and by the sample's release on every other
 * path (eval timeout, cancel, server stop) — an environment may stop it earlier but never has to. It runs inside
 * the eval stage, so `eval.concurrency` bounds how many exist at once. A failure to start it is SANDBOX_ERROR.
 */
export type OpenSandbox = (request?: SandboxRequest) => Promise<Sandbox>;

/** What `evaluate` gets: the episode's context, how the episode ended, and a way to open more sandboxes. */
export interface EvaluationContext<I> extends EnvironmentContext<I> {
  outcome: EpisodeOutcome;
  /**
   * Provided by the pipeline; absent only when an environment is evaluated outside it (e.g. a unit test calling
   * `evaluate` directly), which an environment that needs it reports as an environment_error.
   */
  openSandbox?: OpenSandbox;
}

export interface Evaluation {
  reward: number;
  /** Named finite numbers (e.g. { correct: 1 }); trainers log or shape rewards with them. */
  details: Record<string, number>;
  /** Free-form JSON (checked: no bigints, cycles, NaN, class instances; at most MAX_JSON_DEPTH deep). */
  report: JsonObject;
}

/**
 * An environment plugin: validate instance → init (sandbox setup and first messages) → tools → evaluate.
 * `validate` throws RolloutError.invalid('instance.<field>', reason). `init` and `evaluate` failures are
 * reported as ENVIRONMENT_ERROR, never as reward 0.
 *
 * @example
 * const echo: Environment<{ text: string }> = {
 *   name: 'echo', description: 'says it back', instanceSchema: { type: 'object' },
 *   validate: (x) => x as { text: string },
 *   init: async ({ instance }) => ({ messages: [{ role: 'user', content: instance.text }] }),
 *   tools: () => [],
 *   evaluate: async () => ({ reward: 1, details: {}, report: {} }),
 * };
 */
/** Default stage budgets of an environment, in milliseconds (see {@link Environment.stageTimeouts}). */
export interface StageTimeouts {
  initMs?: number;
  runMs?: number;
  evalMs?: number;
}

export interface Environment<I = unknown> {
  readonly name: string;
  readonly description: string;
  /** JSON Schema of the instance. */
  readonly instanceSchema: Record<string, unknown>;
  /**
   * Names of the tools this environment offers, for ListEnvironments (which has no instance to call `tools`
   * with). Optional because a tool set may depend on the instance; omitted means "not known in advance".
   */
  readonly toolNames?: readonly string[];
  /**
   * Stage budgets this environment needs when a task does not set them (its `limits.*_timeout_ms` win; the
   * server's `init/run/eval.timeoutMs` apply when neither says). For environments whose grading legitimately runs
   * longer than the server's default eval budget (a test suite): without it, a patch that makes the tests hang
   * would end as an infrastructure TIMEOUT instead of the policy outcome (reward 0) it is. When given and the task
   * sets no total, the total budget is at least init + run + eval.
   */
  readonly stageTimeouts?: StageTimeouts;
  validate(instance: unknown): I;
  /**
   * The sandbox this instance needs (image, network, mounts, env, limits); what it leaves out comes from the
   * server's config. Omitted: the configured default sandbox, without network. Also called at submit, so an image
   * outside `sandbox.imageDirs` is refused there: it must only read (one that throws is left to the init stage).
   */
  sandbox?(instance: I): SandboxRequest;
  /**
   * Optional: the first messages `init` will return, when they depend on the instance alone (no sandbox). With it
   * the server measures the prompt at admission and rejects a task whose prompt leaves no room to generate
   * (INVALID_ARGUMENT, field `instance`) instead of starting a sandbox for it; without it the same check happens
   * before the first turn (INVALID_TASK). Must equal what `init` returns for the instance; must not throw for an
   * instance `validate` accepted.
   */
  prompt?(instance: I): ChatMessage[];
  init(context: EnvironmentContext<I>): Promise<{ messages: ChatMessage[] }>;
  tools(instance: I): Tool[];
  evaluate(context: EvaluationContext<I>): Promise<Evaluation>;
}
