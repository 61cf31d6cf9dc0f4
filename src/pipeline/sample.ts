import type { Sandbox } from '../sandboxes/types.js';
import type { ChatMessage } from '../tokens/types.js';
import type { Evaluation, EpisodeOutcome } from '../environments/types.js';
import type { ResolvedTask, SampleTiming, StageName, TrajectorySink } from './task.js';
import type { LedgerSnapshot, TokenLedger } from '../tokens/ledger.js';

/** What the run stage hands to eval. */
export interface RunResult {
  outcome: EpisodeOutcome;
  tokens: LedgerSnapshot;
  /** True when a turn or token budget ended the episode (status TRUNCATED). */
  truncated: boolean;
  numTurns: number;
}

/**
 * One sample (one trajectory) of a task moving through init → run → eval. Owns an AbortController that fires on
 * cancel, total deadline (counted from its entry into the pipeline: {@link Sample.startClock}) and completion;
 * `release` frees the sandbox exactly once, whatever path ends the sample.
 */
export class Sample {
  readonly controller = new AbortController();
  stage: StageName = 'queued';
  finished = false;
  /** True while a stage function is running for this sample. */
  active = false;
  /** The stage whose queue holds this sample, while it waits for a slot there. */
  queuedIn: 'init' | 'run' | 'eval' | undefined;
  /** Holds one of the pipeline's stage permits (from its first init to its finish; see Pipeline). */
  holdsPermit = false;
  /** Cancelled by the server stopping (not by a client, a deadline or an error): see {@link abortForStop}. */
  cancelledByStop = false;
  readonly timing: SampleTiming = { queueMs: 0, initMs: 0, runMs: 0, llmMs: 0, toolMs: 0, evalMs: 0, totalMs: 0 };
  /**
   * When the sample entered the pipeline ({@link startClock}; its construction until then): its total timeout, queue
   * and total times count from here.
   */
  submittedAt = performance.now();
  sandbox: Sandbox | undefined;
  initialMessages: ChatMessage[] = [];
  run: RunResult | undefined;
  /** The run stage's token ledger, kept so a sample that fails mid-run still reports the tokens it got to. */
  ledger: TokenLedger | undefined;
  evaluation: Evaluation | undefined;
  /** Sandboxes the environment opened during eval (Environment.evaluate's openSandbox); released with the sample. */
  private readonly extraSandboxes = new Set<Sandbox>();
  /** Times the sample was run again from scratch because it was too stale (TaskLimits.staleness_action RESTART). */
  stalenessRestarts = 0;
  /** Set by a stage that wants the sample to go through init again (see {@link restart}); read by the pipeline. */
  restartRequested = false;
  private totalTimer: NodeJS.Timeout | undefined;
  private clockStarted = false;

  constructor(
    readonly task: ResolvedTask,
    readonly index: number,
    readonly sink: TrajectorySink,
  ) {}

  /**
   * Starts the sample's total timeout; the pipeline calls it as the sample enters (Pipeline.submit), once. Not at
   * construction: samples recovered from the journal are made at start-up and then wait for admission behind each
   * other, and a clock running during that wait failed them TIMEOUT for the server's own backlog, work they never got
   * to do — where a new task's samples are made once admitted. Idempotent; nothing once the sample is released.
   */
  startClock(): void {
    if (this.clockStarted) return;
    this.clockStarted = true;
    this.submittedAt = performance.now();
    this.totalTimer = setTimeout(() => {
      this.abort('deadline_exceeded', `total timeout of ${this.task.limits.totalTimeoutMs} ms exceeded`);
    }, this.task.limits.totalTimeoutMs);
    this.totalTimer.unref();
  }

  get key(): string {
    return `${this.task.taskId}#${this.index}`;
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /**
   * Cancels the sample because the server is stopping — unless something ended it first (a client's cancel, a
   * deadline): only a sample whose own outcome this is is marked, so a journal can leave exactly those to run again.
   */
  abortForStop(message: string): void {
    if (this.controller.signal.aborted) return;
    this.cancelledByStop = true;
    this.abort('cancelled', message);
  }

  abort(code: 'deadline_exceeded' | 'cancelled', message: string): void {
    if (!this.controller.signal.aborted) {
      const reason = new Error(message);
      reason.name = code === 'deadline_exceeded' ? 'TimeoutError' : 'AbortError';
      this.controller.abort(reason);
    }
  }

  /**
   * Takes ownership of a sandbox opened for this sample beyond its own (see OpenSandbox): it is stopped by
   * `release`. A sample already finished stops it at once and says so (the caller must not use it).
   */
  async adoptSandbox(sandbox: Sandbox): Promise<boolean> {
    if (this.finished) {
      await sandbox.stop();
      return false;
    }
    this.extraSandboxes.add(sandbox);
    return true;
  }

  /** Stops the adopted sandboxes that are still running (the eval stage calls it when evaluate settles). */
  async stopExtraSandboxes(): Promise<void> {
    const sandboxes = [...this.extraSandboxes];
    this.extraSandboxes.clear();
    const results = await Promise.allSettled(sandboxes.map((s) => s.stop()));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }

  /**
   * Forgets the run so far — sandbox stopped, messages, ledger and results cleared — and asks the pipeline to send
   * the sample through init again. Its total timeout keeps running from the first start, so restarts are bounded in
   * time too.
   */
  async restart(): Promise<void> {
    const sandbox = this.sandbox;
    this.sandbox = undefined;
    this.initialMessages = [];
    this.run = undefined;
    this.ledger = undefined;
    this.evaluation = undefined;
    this.restartRequested = true;
    if (sandbox) await sandbox.stop();
  }

  /** Stops the sandboxes (the sample's own and any adopted) and the total timer; idempotent. Throws the first stop failure after trying all. */
  async release(): Promise<void> {
    this.clockStarted = true;
    if (this.totalTimer) clearTimeout(this.totalTimer);
    this.totalTimer = undefined;
    const sandbox = this.sandbox;
    this.sandbox = undefined;
    const results = await Promise.allSettled([sandbox?.stop(), this.stopExtraSandboxes()]);
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }
}
