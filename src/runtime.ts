import { config as rxConfig, filter } from 'rxjs';
import { RolloutError } from './errors.js';
import type { ServerConfig } from './config.js';
import type { Logger } from './observability/logger.js';
import type { EnvironmentRegistry } from './environments/registry.js';
import type { SandboxDriver } from './sandboxes/types.js';
import type { BackendPool } from './backends/pool.js';
import type { ChatTemplate, Tokenizer } from './tokens/types.js';
import { TokenWork } from './tokens/token-work.js';
import type { ToolCallParser } from './tools/types.js';
import type { TaskSpec, Trajectory } from '../gen/ts/rollout/v1/rollout.js';
import { Admission } from './pipeline/admission.js';
import { Pipeline } from './pipeline/pipeline.js';
import { Sample } from './pipeline/sample.js';
import { createStages } from './pipeline/stages.js';
import { TaskStore, type TaskEntry } from './pipeline/task-store.js';
import type { TrajectorySink } from './pipeline/task.js';
import { checkPromptFits, validateTask } from './pipeline/validate-task.js';
import { linkedController } from './pipeline/rx.js';
import { ServerLifecycle } from './lifecycle.js';

export interface RuntimeDeps {
  config: ServerConfig;
  registry: EnvironmentRegistry;
  sandboxes: SandboxDriver;
  pool: BackendPool;
  tokenizer: Tokenizer;
  template: ChatTemplate;
  /** Rendering and tokenizing (with token threads for large inputs); inline on the event loop when absent. */
  tokenWork?: TokenWork;
  parser: ToolCallParser;
  logger: Logger;
  /** The server's lifecycle (admission stops when it drains); a fresh one when absent (tests of the runtime alone). */
  lifecycle?: ServerLifecycle;
}

export interface SubmitResult {
  taskId: string;
  numSamples: number;
  duplicate: boolean;
}

/**
 * The server's core, independent of gRPC: validates and admits tasks, expands them into samples, runs them
 * through the pipeline and routes each finished trajectory to the task's sinks and store.
 */
export class RolloutRuntime {
  readonly pipeline: Pipeline;
  readonly store: TaskStore;
  readonly admission: Admission;
  readonly lifecycle: ServerLifecycle;
  private readonly log: Logger;
  private stopped = false;

  constructor(readonly deps: RuntimeDeps) {
    this.log = deps.logger.child({ component: 'runtime' });
    const { config } = deps;
    this.lifecycle = deps.lifecycle ?? new ServerLifecycle();
    this.store = new TaskStore(config.retainFinishedTasks, config.retainFinishedBytes);
    this.admission = new Admission(config.maxAdmitted);
    this.pipeline = new Pipeline(
      createStages(deps),
      { init: { concurrency: config.init.concurrency }, run: { concurrency: config.run.concurrency }, eval: { concurrency: config.eval.concurrency } },
      deps.logger.child({ component: 'pipeline' }),
      config.maxMessageBytes,
    );
  }

  start(): void {
    // RxJS rethrows a subscriber's error on a timer, which would take the whole process down for one bad
    // callback: log it instead (the callbacks themselves handle their own failures; this is the last net).
    rxConfig.onUnhandledError = (err: unknown) => this.log.error({ err }, 'unhandled error in an RxJS subscriber');
    this.pipeline.start();
  }

  /**
   * Validates, waits for admission (this is where a full server pushes back), and queues the task's samples.
   * Idempotent on task_id: a retry with the same spec returns duplicate = true, and `sink` still receives every
   * trajectory of the task (finished ones at once). Throws RolloutError('invalid_argument') naming the field.
   */
  async submit(spec: TaskSpec, sink?: TrajectorySink, callSignal?: AbortSignal): Promise<SubmitResult> {
    this.throwIfNotAdmitting();
    // Draining gives up every wait for admission at once: the caller hears UNAVAILABLE "draining", not a hang. The
    // link to the long-lived admission signal is undone when the submit settles, so listeners do not pile up on it.
    const { controller, dispose } = linkedController(this.lifecycle.admission);
    const onCall = (): void => controller.abort(callSignal?.reason);
    if (callSignal?.aborted) onCall();
    else callSignal?.addEventListener('abort', onCall, { once: true });
    try {
      return await this.admit(spec, sink, controller.signal);
    } finally {
      dispose();
      callSignal?.removeEventListener('abort', onCall);
    }
  }

  private async admit(spec: TaskSpec, sink: TrajectorySink | undefined, signal: AbortSignal): Promise<SubmitResult> {
    const { tokenizer, template, pool } = this.deps;
    const task = validateTask(spec, this.deps.registry, this.deps.config);
    const known = this.store.existing(task);
    if (known) return this.duplicate(known, sink);
    const work = this.deps.tokenWork ?? TokenWork.inline(tokenizer, template);
    await checkPromptFits(task, { work, maxModelLen: () => pool.minMaxModelLen() }, signal);
    await this.admission.admit(task.numSamples, signal);
    // While we waited, the server may have begun stopping or the same task_id may have arrived (as a retry, or
    // with another spec): give the capacity back on every such path.
    let raced: TaskEntry | undefined;
    try {
      this.throwIfNotAdmitting();
      raced = this.store.existing(task);
    } catch (err) {
      this.admission.release(task.numSamples);
      throw err;
    }
    if (raced) {
      this.admission.release(task.numSamples);
      return this.duplicate(raced, sink);
    }
    const entry = this.store.add(task);
    if (sink) entry.sinks.add(sink);
    const onFinished = (trajectory: Trajectory): void => {
      this.admission.release(1);
      this.store.record(trajectory);
    };
    entry.samples = Array.from({ length: task.numSamples }, (_, i) => new Sample(task, i, onFinished));
    this.pipeline.submit(entry.samples);
    this.log.debug({ taskId: task.taskId, numSamples: task.numSamples, environment: task.environment.name }, 'task accepted');
    return { taskId: task.taskId, numSamples: task.numSamples, duplicate: false };
  }

  /** Cancels every unfinished sample of a task; returns how many were cancelled. */
  cancel(taskId: string): number {
    const entry = this.store.get(taskId);
    if (!entry) throw new RolloutError('not_found', `unknown task_id "${taskId}"`);
    let cancelled = 0;
    for (const sample of entry.samples) {
      if (!sample.finished) {
        this.pipeline.cancel(sample);
        cancelled++;
      }
    }
    return cancelled;
  }

  /**
   * Resolves once no admitted sample is unfinished (every one was handed to its sinks), or when `signal` fires.
   * With admission stopped (draining) this is "the work in flight has finished".
   */
  async idle(signal?: AbortSignal): Promise<void> {
    while (this.pipeline.inFlight > 0 && !signal?.aborted) {
      await new Promise<void>((resolve) => {
        const sub = this.pipeline.events$.pipe(filter((e) => e.type === 'finished')).subscribe(() => done());
        const done = (): void => {
          sub.unsubscribe();
          signal?.removeEventListener('abort', done);
          resolve();
        };
        signal?.addEventListener('abort', done, { once: true });
      });
    }
  }

  /**
   * Stops accepting work and cancels what is in flight: each unfinished sample is delivered with status CANCELLED
   * and `reason` as its error (never as a completed trajectory), its sandbox released before stop resolves.
   */
  async stop(reason = 'server stopping'): Promise<void> {
    this.stopped = true;
    await this.pipeline.stop(reason);
  }

  private throwIfNotAdmitting(): void {
    if (this.stopped) throw new RolloutError('unavailable', 'server is stopping');
    if (!this.lifecycle.admitting) {
      throw new RolloutError('unavailable', this.lifecycle.state === 'starting' ? 'server is starting' : 'server is draining: not accepting new tasks');
    }
  }

  private duplicate(entry: TaskEntry, sink: TrajectorySink | undefined): SubmitResult {
    if (sink && entry.pending > 0) entry.sinks.add(sink);
    // After the caller has answered `accepted`, so a stream sees the acceptance before the task's trajectories.
    if (sink) setImmediate(() => entry.trajectories.forEach((t) => t && sink(t)));
    return { taskId: entry.task.taskId, numSamples: entry.task.numSamples, duplicate: true };
  }
}
