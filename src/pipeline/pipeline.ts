import { defer, EMPTY, Subject, type OperatorFunction, type Subscription, catchError, mergeMap, tap, filter, identity } from 'rxjs';
import { classifyThrown, RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import { FailureLog } from '../observability/failure-log.js';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { raceAbort } from './rx.js';
import { yieldIfBusy } from './yield.js';
import type { Sample } from './sample.js';
import type { StageName } from './task.js';
import { buildFailedTrajectory, buildTrajectory } from './trajectory.js';
import { wireSafe } from './wire-safe.js';

/** The work of one stage on one sample. It must honour `signal`; the pipeline also races it against the signal. */
export type StageFn = (sample: Sample, signal: AbortSignal) => Promise<void>;

export interface StageFns {
  init: StageFn;
  run: StageFn;
  eval: StageFn;
}

export interface StageSettings {
  concurrency: number;
}

export type PipelineEvent =
  | { type: 'stage'; sample: Sample; stage: StageName }
  | { type: 'finished'; sample: Sample; trajectory: Trajectory };

export interface StageStats {
  stage: 'init' | 'run' | 'eval';
  concurrency: number;
  active: number;
  queued: number;
}

type WorkStage = 'init' | 'run' | 'eval';

/** Abort reason for leftovers of a finished sample; one shared object (an Error per sample costs a stack trace). */
const SAMPLE_FINISHED: Error = Object.assign(new Error('sample finished'), { name: 'AbortError' });
const STAGES: readonly WorkStage[] = ['init', 'run', 'eval'];

/**
 * The assembly line: init → run → eval, each a mergeMap with its own concurrency limit and per-sample timeout
 * (from the task's limits). A sample that fails, times out or is cancelled leaves the line at once with its
 * status; every path ends in `finish`, which releases the sample's sandbox before the trajectory is delivered.
 * Samples are delivered in completion order.
 */
export class Pipeline {
  readonly events$ = new Subject<PipelineEvent>();
  private readonly input$ = new Subject<Sample>();
  private readonly stats: Record<WorkStage, { active: number; queued: number }> = {
    init: { active: 0, queued: 0 },
    run: { active: 0, queued: 0 },
    eval: { active: 0, queued: 0 },
  };
  private readonly live = new Set<Sample>();
  /**
   * Stage permits, init + run + eval concurrency of them: a sample takes one before its first init (where it gets a
   * sandbox) and gives it back when it finishes. Without them init ran ahead of a full run stage for every admitted
   * sample (stages hand on through unbounded mergeMap buffers): up to maxAdmitted live sandboxes, each past its
   * environment's setup, waiting for a run slot. With them at most this many samples hold a sandbox; the rest wait
   * before init, holding nothing. A sample sent back to init (a staleness restart) keeps its permit, so no cycle of
   * waits can form: every permit holder is in a stage or queued for one, and every stage drains on its own.
   */
  private readonly permits: Permits;
  private readonly finishing = new Map<Sample, Promise<void>>();
  private subscription: Subscription | undefined;
  private readonly failures: FailureLog;
  completedTotal = 0;

  constructor(
    private readonly fns: StageFns,
    private readonly settings: Record<WorkStage, StageSettings>,
    private readonly log: Logger,
    /** Largest encoded message the server may send (grpc max_send_message_length): trajectories are kept under it. */
    private readonly maxMessageBytes: number = 64 << 20,
  ) {
    this.failures = new FailureLog(log);
    this.permits = new Permits(settings.init.concurrency + settings.run.concurrency + settings.eval.concurrency);
  }

  start(): void {
    if (this.subscription) return;
    this.subscription = this.input$.pipe(this.stage$('init'), this.stage$('run'), this.stage$('eval')).subscribe({
      next: (sample) => void this.finish(sample, this.completed(sample)),
      // Unreachable by construction (every stage catches per sample); if it ever happens, the line is dead and
      // must say so loudly rather than leave samples hanging silently.
      error: (err: unknown) => this.log.fatal({ err }, 'pipeline stopped: a stage errored outside its per-sample handling'),
    });
  }

  /** The trajectory of a sample that went through eval; a throw while building it fails that sample alone. */
  private completed(sample: Sample): Trajectory {
    try {
      return buildTrajectory(sample);
    } catch (err) {
      this.log.error({ err, sample: sample.key }, 'building the trajectory failed');
      return buildFailedTrajectory(sample, new RolloutError('environment_error', `building the trajectory failed: ${err instanceof Error ? err.message : String(err)}`, { cause: err }));
    }
  }

  /**
   * Queues samples (the caller has already passed admission) and starts their total timeouts. One already cancelled
   * (a sample recovered from the journal and cancelled while it waited for admission) is finished here, at once: it
   * would otherwise wait for a stage permit only to be failed by its init.
   */
  submit(samples: readonly Sample[]): void {
    const queued: Sample[] = [];
    for (const sample of samples) {
      // Already delivered (nothing to run): in `live` it would never leave, and a drain would wait for it for good.
      if (sample.finished) continue;
      this.live.add(sample);
      sample.startClock();
      if (sample.signal.aborted) {
        this.events$.next({ type: 'stage', sample, stage: 'queued' });
        void this.finish(sample, buildFailedTrajectory(sample, RolloutError.from(sample.signal.reason)));
        continue;
      }
      queued.push(sample);
      // A sample waiting for a slot (queued, or between stages) has no stage to reject: its cancel or total
      // deadline finishes it here, at once. A running one is finished by its stage's rejection.
      sample.signal.addEventListener(
        'abort',
        () => {
          // Finishing aborts the signal too (to release what listens to it): nothing to build then.
          if (!sample.active && !sample.finished) void this.finish(sample, buildFailedTrajectory(sample, RolloutError.from(sample.signal.reason)));
        },
        { once: true },
      );
      this.events$.next({ type: 'stage', sample, stage: 'queued' });
    }
    for (const sample of queued) this.input$.next(sample);
  }

  /** Cancels a sample: aborts its running stage, or finishes it at once if it is waiting for a slot. */
  cancel(sample: Sample, reason = 'cancelled by client'): void {
    sample.abort('cancelled', reason);
  }

  get inFlight(): number {
    return this.live.size;
  }

  stageStats(): StageStats[] {
    return STAGES.map((stage) => ({ stage, concurrency: this.settings[stage].concurrency, ...this.stats[stage] }));
  }

  /** Cancels everything in flight (status CANCELLED, `reason` as the error) and stops the line. */
  async stop(reason = 'server stopping'): Promise<void> {
    const live = [...this.live];
    for (const sample of live) sample.abortForStop(reason);
    // Running samples are finished here too (not left to their stage's rejection, which the unsubscribe below
    // would drop); then every finish under way — including those the aborts just started — is awaited, so every
    // sandbox is released and every sink hears CANCELLED before stop resolves.
    for (const sample of live) void this.finish(sample, buildFailedTrajectory(sample, RolloutError.from(sample.signal.reason)));
    await Promise.all(this.finishing.values());
    this.subscription?.unsubscribe();
    this.subscription = undefined;
    this.input$.complete();
  }

  private stage$(name: WorkStage): OperatorFunction<Sample, Sample> {
    const counters = this.stats[name];
    const timeoutOf = (sample: Sample): number =>
      name === 'init' ? sample.task.limits.initTimeoutMs : name === 'run' ? sample.task.limits.runTimeoutMs : sample.task.limits.evalTimeoutMs;
    return (source) =>
      source.pipe(
        tap((sample) => {
          counters.queued++;
          sample.queuedIn = name;
        }),
        // Before init, a sample takes a stage permit (counted as queued for init while it waits): see `permits`.
        name === 'init' ? this.permitted() : identity,
        mergeMap(
          (sample) =>
            defer(async () => {
              // Still counted as queued while the loop takes its turn (see yieldIfBusy).
              for (let turn = yieldIfBusy(); turn; turn = yieldIfBusy()) await turn;
              if (sample.queuedIn === name) {
                counters.queued--;
                sample.queuedIn = undefined;
              }
              if (sample.finished) return undefined;
              counters.active++;
              sample.active = true;
              this.enter(sample, name);
              // The stage's deadline aborts the sample itself: a stage that runs out of time ends its sample (TIMEOUT),
              // so a controller of its own per stage (three per sample, each linked to the sample's) bought nothing.
              const ms = timeoutOf(sample);
              const deadline = setTimeout(() => sample.abort('deadline_exceeded', `${name} stage timed out after ${ms} ms`), ms);
              deadline.unref();
              const started = performance.now();
              try {
                await raceAbort(this.fns[name](sample, sample.signal), sample.signal);
                return sample;
              } finally {
                clearTimeout(deadline);
                sample.timing[`${name}Ms`] += performance.now() - started;
                sample.active = false;
                counters.active--;
              }
            }).pipe(
              catchError((err: unknown) => {
                void this.finish(sample, buildFailedTrajectory(sample, classifyThrown(err, 'internal', sample.signal)));
                return EMPTY;
              }),
              filter((s): s is Sample => s !== undefined && !s.finished && !this.restarted(s)),
            ),
          this.settings[name].concurrency,
        ),
      );
  }

  /** Passes each sample on once it holds a stage permit; drops one that finished while it waited. */
  private permitted(): OperatorFunction<Sample, Sample> {
    return (source) =>
      source.pipe(
        mergeMap((sample) => (sample.holdsPermit ? Promise.resolve(sample) : this.permits.take(sample))),
        filter((s): s is Sample => s !== undefined),
      );
  }

  /**
   * A stage asked for the sample to start over (Sample.restart, e.g. too stale): it goes back to the line's start
   * instead of on to the next stage. It re-enters on a microtask, outside the operator chain that is emitting it.
   */
  private restarted(sample: Sample): boolean {
    if (!sample.restartRequested) return false;
    sample.restartRequested = false;
    queueMicrotask(() => {
      if (!sample.finished) this.input$.next(sample);
    });
    return true;
  }

  private enter(sample: Sample, stage: StageName): void {
    endQueueTime(sample);
    sample.stage = stage;
    this.events$.next({ type: 'stage', sample, stage });
  }

  /** Ends a sample exactly once: releases its sandbox, then delivers. Returns the one finish under way. */
  private finish(sample: Sample, trajectory: Trajectory): Promise<void> {
    if (sample.finished) return this.finishing.get(sample) ?? Promise.resolve();
    const done = this.deliver(sample, trajectory).finally(() => this.finishing.delete(sample));
    this.finishing.set(sample, done);
    return done;
  }

  private async deliver(sample: Sample, built: Trajectory): Promise<void> {
    // One that never entered a stage (cancelled or out of time while it waited) spent its whole life queued: else its
    // queue time read 0, and the longest waits (those that time out in the queue) vanished from the queue figures.
    endQueueTime(sample);
    sample.finished = true;
    sample.stage = 'done';
    this.live.delete(sample);
    if (sample.holdsPermit) {
      sample.holdsPermit = false;
      this.permits.give();
    } else this.permits.leave(sample);
    if (sample.queuedIn) {
      // Finished while waiting for a slot: it no longer counts as queued (it leaves the mergeMap buffer later).
      this.stats[sample.queuedIn].queued--;
      sample.queuedIn = undefined;
    }
    if (!sample.signal.aborted) sample.controller.abort(SAMPLE_FINISHED);
    try {
      await sample.release();
    } catch (err) {
      this.log.error({ err, sample: sample.key }, 'releasing sandbox failed');
    }
    for (let turn = yieldIfBusy(); turn; turn = yieldIfBusy()) await turn;
    sample.timing.totalMs = performance.now() - sample.submittedAt;
    // Encoded and size-checked once, before anything queues it: a trajectory that cannot go on the wire would end
    // every stream it is written to (see wireSafe).
    // Assigned, not spread: `built` is this sample's own fresh object, and a spread would make a lazily kept
    // prompt's number[] (lazy-prompt.ts).
    built.timing = { ...sample.timing };
    const trajectory = wireSafe(built, this.maxMessageBytes);
    this.completedTotal++;
    this.events$.next({ type: 'stage', sample, stage: 'done' });
    this.events$.next({ type: 'finished', sample, trajectory });
    this.failures.record(trajectory);
    try {
      sample.sink(trajectory);
    } catch (err) {
      this.log.error({ err, sample: sample.key }, 'trajectory sink failed');
    }
  }
}

/**
 * A FIFO counting semaphore of stage permits (see Pipeline.permits). A sample that finishes while it waits leaves the
 * queue at once ({@link leave}): a cancel of samples that have not started (a trainer dropping the rest of a batch)
 * while every permit is held — a long pause, slow episodes — must not keep each of them, task and instance with it,
 * until the permits move on again.
 */
class Permits {
  /** Waiting samples in arrival order (a Map keeps insertion order), each with its take()'s resolve. */
  private readonly waiting = new Map<Sample, (s: Sample | undefined) => void>();

  constructor(private free: number) {}

  /** Resolves with the sample once it holds a permit, or undefined when it finished while waiting (nothing to run). */
  take(sample: Sample): Promise<Sample | undefined> {
    if (sample.finished) return Promise.resolve(undefined);
    if (this.free > 0) {
      this.free--;
      sample.holdsPermit = true;
      return Promise.resolve(sample);
    }
    return new Promise((resolve) => this.waiting.set(sample, resolve));
  }

  /** A sample that finished: out of the queue, if it waited there (its take() resolves undefined). */
  leave(sample: Sample): void {
    const resolve = this.waiting.get(sample);
    if (resolve === undefined) return;
    this.waiting.delete(sample);
    resolve(undefined);
  }

  give(): void {
    for (const [sample, resolve] of this.waiting) {
      this.waiting.delete(sample);
      // One that finished while it waited (cancelled, its total deadline) takes nothing.
      if (sample.finished) {
        resolve(undefined);
        continue;
      }
      sample.holdsPermit = true;
      resolve(sample);
      return;
    }
    this.free++;
  }
}

/** A sample leaving the queue (for its first stage, or finished without one): its queue time is its life until now. */
function endQueueTime(sample: Sample): void {
  if (sample.stage === 'queued') sample.timing.queueMs = performance.now() - sample.submittedAt;
}
