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
import { TaskSpec, Trajectory, TrajectoryStatus } from '../gen/ts/rollout/v1/rollout.js';
import type { Journal } from './journal/journal.js';
import { errorText } from './journal/error-text.js';
import { RateLimitedLog } from './observability/rate-limited-log.js';
import { encodedTrajectory, wireSafe } from './pipeline/wire-safe.js';
import { Admission } from './pipeline/admission.js';
import { Pipeline } from './pipeline/pipeline.js';
import { Sample } from './pipeline/sample.js';
import { createStages } from './pipeline/stages.js';
import { specFingerprint, TaskStore, type TaskEntry } from './pipeline/task-store.js';
import type { ResolvedTask, TrajectorySink } from './pipeline/task.js';
import { checkPromptFits, validateTask } from './pipeline/validate-task.js';
import { yieldIfBusy } from './pipeline/yield.js';
import { linkedController } from './pipeline/rx.js';
import { ServerLifecycle } from './lifecycle.js';

/** At most one line per this many seconds for trajectories the journal could not record (see RolloutRuntime.unrecorded). */
const UNRECORDED_LOG_EVERY_S = 60;

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
  /** The durable journal (config `journal.dir`); absent: everything lives in memory. */
  journal?: Journal;
  /** The server's lifecycle (admission stops when it drains); a fresh one when absent (tests of the runtime alone). */
  lifecycle?: ServerLifecycle;
}

export interface SubmitResult {
  taskId: string;
  numSamples: number;
  duplicate: boolean;
}

/** What {@link RolloutRuntime.submit} is told besides the task. */
export interface SubmitOptions {
  /** Receives every trajectory of the task (a stream's session sink); none for a unary Submit. */
  sink?: TrajectorySink;
  /** The caller's call: aborted, the wait for admission is given up. */
  signal?: AbortSignal;
  /** The session that submitted the task (journaled with it, for resume); '' for none. */
  session?: string;
  /**
   * Called once the task holds its capacity and its id, before the journal's write: a stream reads its next task
   * from there on, so tasks arriving together share one commit instead of an fsync each.
   */
  onAdmitted?: () => void;
  /**
   * For a duplicate: awaited before `sink` is attached to the task and sent its finished trajectories. A stream makes
   * the task's debt to its session durable there (Journal.owed) before it answers `accepted`; a rejection fails the
   * submit, the sink unattached.
   */
  onDuplicate?: () => Promise<void> | undefined;
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
  /** Tasks accepted but not yet on disk: a retry of one waits for (and shares the fate of) the first. */
  private readonly durable = new Map<string, Promise<void>>();
  /** Samples restored from the journal, queued when the pipeline starts. */
  private recovered: Sample[][] = [];
  /**
   * Trajectories the journal could not record (each delivered anyway). A failing disk fails every one that finishes, so
   * a line each — with its stack, as it was — buried the one line that says what is wrong: here one line with the
   * cause (the journal's one-line text: errno and file), then at most one a minute, carrying the count of those not
   * logged (`suppressed`).
   */
  private readonly unrecorded: RateLimitedLog;

  constructor(readonly deps: RuntimeDeps) {
    this.log = deps.logger.child({ component: 'runtime' });
    this.unrecorded = new RateLimitedLog(this.log, { linesPerSecond: 1 / UNRECORDED_LOG_EVERY_S, burst: 1 });
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
    // Re-run what the journal held unfinished, in acceptance order, each task through admission like a new one
    // (FIFO, so tasks submitted after the restart queue behind them).
    const recovered = this.recovered;
    this.recovered = [];
    void recovered.reduce(
      (previous, samples) =>
        previous.then(async () => {
          await this.admission.admit(samples.length);
          if (this.stopped) return this.admission.release(samples.length);
          this.pipeline.submit(samples);
        }),
      Promise.resolve(),
    );
  }

  /**
   * Restores a task from the journal (before `start`): its finished trajectories are recorded as they were, the
   * sinks (its session's) receive them, and its unfinished samples are queued again when the pipeline starts —
   * the same spec, so the same samples and seeds.
   */
  restore(task: ResolvedTask, finished: ReadonlyMap<number, Trajectory>, sinks: readonly TrajectorySink[]): void {
    const entry = this.store.add(task);
    for (const sink of sinks) entry.sinks.add(sink);
    for (const trajectory of finished.values()) this.store.record(trajectory);
    entry.samples = [];
    for (let i = 0; i < task.numSamples; i++) if (!finished.has(i)) entry.samples.push(this.newSample(task, i));
    if (entry.samples.length > 0) this.recovered.push(entry.samples);
  }

  /**
   * Adds a task from the journal that no longer validates (at recovery, or revived after the store let go of it: see
   * {@link reviveUnrunnable}): none of its samples runs; its `finished` trajectories are recorded as they were, and
   * every other sample ends INVALID_TASK with `reason`, journaled, then recorded (a failed write still records it). So
   * GetTrajectory finds it like any finished task, `sinks` get its trajectories, and a re-submit of the same spec is its
   * duplicate (TaskStore.unrunnable).
   */
  restoreUnrunnable(spec: TaskSpec, numSamples: number, finished: ReadonlyMap<number, Trajectory>, reason: string, sinks: readonly TrajectorySink[]): TaskEntry {
    const { journal, config } = this.deps;
    const entry = this.store.addUnrunnable(spec, numSamples);
    for (const sink of sinks) entry.sinks.add(sink);
    for (const t of finished.values()) this.store.record(t);
    for (let i = 0; i < numSamples; i++) {
      if (finished.has(i)) continue;
      const t = wireSafe(
        Trajectory.fromPartial({ taskId: spec.taskId, sampleIndex: i, groupId: spec.groupId, environment: spec.environment, status: TrajectoryStatus.TRAJECTORY_STATUS_INVALID_TASK, finishReason: 'error', error: reason, metadata: spec.metadata }),
        config.maxMessageBytes,
      );
      if (!journal) {
        this.store.record(t);
        continue;
      }
      // Recorded (so delivered) once committed, as the pipeline's trajectories are; a failed write still records it.
      journal.finished(spec.taskId, i, Trajectory.encode(t).finish()).then(
        () => this.store.record(t),
        (err: unknown) => {
          this.unrecorded.write('error', () => ({ taskId: spec.taskId, sampleIndex: i, reason: errorText(err) }), 'journal could not record an INVALID_TASK trajectory; delivered anyway');
          this.store.record(t);
        },
      );
    }
    return entry;
  }

  /**
   * Validates, waits for admission (this is where a full server pushes back), and queues the task's samples.
   * Idempotent on task_id: a retry with the same spec returns duplicate = true, and `options.sink` still receives
   * every trajectory of the task (finished ones at once). Throws RolloutError('invalid_argument') naming the field.
   */
  async submit(spec: TaskSpec, options: SubmitOptions = {}): Promise<SubmitResult> {
    const { sink, signal: callSignal, session = '', onAdmitted, onDuplicate } = options;
    this.throwIfNotAdmitting();
    // Draining gives up every wait for admission at once: the caller hears UNAVAILABLE "draining", not a hang. The
    // link to the long-lived admission signal is undone when the submit settles, so listeners do not pile up on it.
    const { controller, dispose } = linkedController(this.lifecycle.admission);
    const onCall = (): void => controller.abort(callSignal?.reason);
    if (callSignal?.aborted) onCall();
    else callSignal?.addEventListener('abort', onCall, { once: true });
    try {
      return await this.admit(spec, sink, controller.signal, session, onAdmitted, onDuplicate);
    } finally {
      dispose();
      callSignal?.removeEventListener('abort', onCall);
    }
  }

  /**
   * `onAdmitted` is called once the task holds its capacity and its id, before the journal's write: a stream reads
   * its next task from there on, so tasks arriving together share one commit instead of an fsync each.
   */
  private async admit(
    spec: TaskSpec,
    sink: TrajectorySink | undefined,
    signal: AbortSignal,
    session: string,
    onAdmitted?: () => void,
    onDuplicate?: () => Promise<void> | undefined,
  ): Promise<SubmitResult> {
    const { tokenizer, template, pool } = this.deps;
    for (let turn = yieldIfBusy(); turn; turn = yieldIfBusy()) await turn;
    // A task recovered from the journal that no longer validates is still the task it was: a re-submit of its spec
    // (which would fail validation again) is its duplicate.
    const unrunnable = this.store.unrunnable(spec);
    if (unrunnable) return this.duplicate(unrunnable, sink, onDuplicate);
    let task: ResolvedTask;
    try {
      task = validateTask(spec, this.deps.registry, this.deps.config);
    } catch (err) {
      const revived = this.reviveUnrunnable(spec, err);
      if (revived) return this.duplicate(revived, sink, onDuplicate);
      throw err;
    }
    const known = this.store.existing(task) ?? this.revive(spec, task);
    if (known) return this.duplicate(known, sink, onDuplicate);
    const work = this.deps.tokenWork ?? TokenWork.inline(tokenizer, template);
    await checkPromptFits(task, { work, maxModelLen: () => pool.minMaxModelLen(), logger: this.log }, signal);
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
      return this.duplicate(raced, sink, onDuplicate);
    }
    const entry = this.store.add(task);
    if (sink) entry.sinks.add(sink);
    onAdmitted?.();
    const { journal } = this.deps;
    if (journal) {
      // On disk before the caller answers `accepted` (Journal.accepted waits for the fsync); a failure (journal
      // full, disk full) takes the task back as if it had never arrived, so the client may submit it again.
      const durable = journal.accepted(task.taskId, TaskSpec.encode(spec).finish(), task.numSamples, session);
      this.durable.set(task.taskId, durable);
      try {
        await durable;
      } catch (err) {
        this.store.remove(task.taskId);
        this.admission.release(task.numSamples);
        throw err;
      } finally {
        this.durable.delete(task.taskId);
      }
    }
    entry.samples = Array.from({ length: task.numSamples }, (_, i) => this.newSample(task, i));
    this.pipeline.submit(entry.samples);
    // Cancelled while its journal write was under way (the task was found, its samples did not exist yet).
    if (entry.cancelRequested) for (const sample of entry.samples) this.pipeline.cancel(sample);
    this.log.debug({ taskId: task.taskId, numSamples: task.numSamples, environment: task.environment.name }, 'task accepted');
    return { taskId: task.taskId, numSamples: task.numSamples, duplicate: false };
  }

  /**
   * Cancels every unfinished sample of a task; returns how many were cancelled. A task accepted a moment ago whose
   * journal write is under way has no samples yet: it is marked, and its samples are cancelled as they are made.
   */
  cancel(taskId: string): number {
    if (!taskId) throw RolloutError.invalid('task_id', 'required');
    const entry = this.store.get(taskId);
    if (!entry) throw new RolloutError('not_found', `unknown task_id "${taskId}"`);
    if (entry.samples.length === 0 && !entry.unrunnable && entry.pending > 0 && this.durable.has(taskId)) {
      entry.cancelRequested = true;
      return entry.pending;
    }
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

  /** A sample whose finished trajectory goes to onFinished. */
  private newSample(task: ResolvedTask, index: number): Sample {
    const sample: Sample = new Sample(task, index, (trajectory) => this.onFinished(trajectory, sample));
    return sample;
  }

  /**
   * Where every finished sample goes. With a journal its bytes are committed first, so a trajectory reaches a
   * client only once a restart would find it (and never runs again after it was delivered). Samples cancelled by
   * the server stopping (Sample.cancelledByStop) are neither journaled nor delivered: the restart runs them again, so
   * the client gets one trajectory for them, not a CANCELLED one and then another (those that finish while it stops,
   * and those a client cancelled, are kept). A failed write (disk full) still delivers — accepted work continues —
   * and is logged: that sample would run again after a crash.
   */
  private onFinished(trajectory: Trajectory, sample: Sample): void {
    this.admission.release(1);
    const { journal } = this.deps;
    if (!journal) return this.store.record(trajectory);
    // Only the stop's own cancels: a sample a client cancelled (or that ran out of time) while the server stopped
    // ended on its own account, so it is journaled and delivered — it must not run again after the restart.
    if (sample.cancelledByStop && trajectory.status === TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED) return;
    const bytes = encodedTrajectory(trajectory) ?? Trajectory.encode(trajectory).finish();
    journal.finished(trajectory.taskId, trajectory.sampleIndex, bytes).then(
      () => this.store.record(trajectory),
      (err: unknown) => {
        this.unrecorded.write('error', () => ({ taskId: trajectory.taskId, sampleIndex: trajectory.sampleIndex, reason: errorText(err) }), 'journal could not record a finished trajectory; delivered anyway');
        this.store.record(trajectory);
      },
    );
  }

  /**
   * A task the store let go of (finished, past retention or shed for the journal's bound) that the journal still holds:
   * owed, maybe, to a session that has not acked it. Its id is still taken: a re-submit is its duplicate, served from
   * the journal's spec and trajectories (the store holds it again), never a new acceptance — that would overwrite its
   * journal record, and with it every other session's debt, and roll it out a second time. For a trainer the task id is
   * the idempotency key: the same id gets the same trajectories, whatever memory kept. A sample the journal lacks (its
   * write failed) runs again, as after a restart. Another spec under the id is refused, as for a task in the store.
   */
  private revive(spec: TaskSpec, task: ResolvedTask): TaskEntry | undefined {
    const held = this.deps.journal?.held(task.taskId);
    if (!held) return undefined;
    const { registry, config } = this.deps;
    const first = TaskSpec.decode(held.spec);
    let same: boolean;
    try {
      same = validateTask(first, registry, config).fingerprint === task.fingerprint;
    } catch {
      // Recovered unrunnable (it no longer validates): compared as sent.
      same = specFingerprint(first) === specFingerprint(spec);
    }
    if (!same) throw RolloutError.invalid('task_id', `"${task.taskId}" was already submitted with a different spec`);
    const entry = this.store.add(task);
    for (const bytes of held.finished.values()) this.store.record(wireSafe(Trajectory.decode(bytes), config.maxMessageBytes));
    const samples: Sample[] = [];
    for (let i = 0; i < task.numSamples; i++) if (!held.finished.has(i)) samples.push(this.newSample(task, i));
    entry.samples = samples;
    if (samples.length > 0) {
      void this.admission.admit(samples.length).then(() => (this.stopped ? this.admission.release(samples.length) : this.pipeline.submit(samples)));
    }
    this.log.info({ taskId: task.taskId, rerun: samples.length }, 'a task the store had let go of was re-submitted: served from the journal');
    return entry;
  }

  /**
   * {@link revive} for a spec that fails validation (`invalid`): a task recovered unrunnable that the store let go of
   * while the journal still holds it (the same spec as sent). Its duplicate, served from the journal, never a refusal:
   * a session the journal still owes it to (or a trainer retrying its idempotent submit) must get the same
   * INVALID_TASK trajectories, whatever memory kept. Once the journal no longer holds it (every session it was owed to
   * acked it) the id is free: the spec is a new task, refused by its validation like any.
   */
  private reviveUnrunnable(spec: TaskSpec, invalid: unknown): TaskEntry | undefined {
    const { journal, config } = this.deps;
    if (!journal || this.store.get(spec.taskId)) return undefined;
    const held = journal.held(spec.taskId);
    if (!held) return undefined;
    const first = TaskSpec.decode(held.spec);
    if (specFingerprint(first) !== specFingerprint(spec)) return undefined; // another spec under the id: refused
    const reason = `after a server restart the task could not be run again: ${RolloutError.from(invalid).message}`;
    const finished = new Map<number, Trajectory>();
    for (const [i, bytes] of held.finished) finished.set(i, wireSafe(Trajectory.decode(bytes), config.maxMessageBytes));
    this.log.info({ taskId: spec.taskId }, 'a task recovered unrunnable that the store had let go of was re-submitted: served from the journal');
    return this.restoreUnrunnable(first, held.numSamples, finished, reason, []);
  }

  private async duplicate(entry: TaskEntry, sink: TrajectorySink | undefined, onDuplicate?: () => Promise<void> | undefined): Promise<SubmitResult> {
    // A retry of a task still being written waits for it: `accepted` only once it is on disk, or the same error.
    await this.durable.get(entry.task.taskId);
    // The caller's own record of it (its session's debt) first: nothing reaches the sink before that is durable.
    await onDuplicate?.();
    if (sink && entry.pending > 0) entry.sinks.add(sink);
    // After the caller has answered `accepted`, so a stream sees the acceptance before the task's trajectories.
    if (sink) setImmediate(() => entry.trajectories.forEach((t) => t && sink(t.trajectory())));
    return { taskId: entry.task.taskId, numSamples: entry.task.numSamples, duplicate: true };
  }
}
