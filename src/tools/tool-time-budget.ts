import { RolloutError } from '../errors.js';
import type { DirEntry, ExecOptions, ExecResult, FileOptions, PersistentShell, Sandbox, SandboxProcess, SandboxSpec, ShellResult, ShellRunOptions, SpawnOptions } from '../sandboxes/types.js';

/** finish_reason of an episode ended by its tool-time budget (status TRUNCATED: the policy's own outcome). */
export const TOOL_TIME_FINISH_REASON = 'tool_time_budget';

export interface ToolTimeBudgetOptions {
  /** Milliseconds the model's tool calls of the episode may take in total. */
  budgetMs: number;
  /**
   * performance.now() by which every tool call must have ended (default none): the sandbox's wall clock less what the
   * evaluation needs of it, so eval still has a live sandbox after the model used up the sandbox's time.
   */
  endBy?: number;
  /** What `endBy` is, for the error of an episode whose time ran out outside its tool calls (default "its end"). */
  endByLabel?: string;
}

/**
 * Less than this left counts as nothing left: no command runs in it (a shell round trip takes longer), and a timer may
 * fire a millisecond early, so a call cut where the budget ended could otherwise leave a sliver "remaining".
 */
const MIN_COMMAND_MS = 100;

/**
 * The time the model's own tool calls may spend in one episode — a budget of the episode, like its turns and tokens.
 * Every command a tool runs through {@link sandbox} is given at most what is left ({@link remainingMs}) as its timeout,
 * so a call that would run past the budget is cut where the budget ends (the shell interrupts it, exec kills it); the
 * time each call took is charged ({@link charge}). Once nothing is left the budget is {@link exhausted}: the agent loop
 * ends the episode TRUNCATED with finish_reason {@link TOOL_TIME_FINISH_REASON} and the evaluation runs as usual.
 *
 * Why: before, a call running into the sandbox's wall clock failed deadline_exceeded (TIMEOUT, which trainers drop as
 * infrastructure noise) and so did the run stage's deadline, so a policy heading for reward 0 could stall its way out
 * of it (`sleep 100000`, an infinite loop). Time the model's calls spend is the policy's doing; only time the server or
 * the engine lose stays TIMEOUT.
 *
 * Invariant: {@link remainingMs} never exceeds `budgetMs` − charged nor `endBy` − now; {@link exhausted} is true
 * exactly when it is under MIN_COMMAND_MS (100 ms), so a call cut where the budget ended always exhausts it.
 */
export class ToolTimeBudget {
  private usedMs = 0;
  /** The sample's sandbox as the model's tools see it: commands bounded by the budget (one object per episode). */
  readonly sandbox: Sandbox;

  constructor(
    inner: Sandbox,
    private readonly options: ToolTimeBudgetOptions,
  ) {
    this.sandbox = new BudgetedSandbox(inner, this);
  }

  get budgetMs(): number {
    return this.options.budgetMs;
  }

  /** Milliseconds of tool time charged so far. */
  get spentMs(): number {
    return this.usedMs;
  }

  /** What the next command may take, ms (under MIN_COMMAND_MS: nothing, see {@link exhausted}). */
  remainingMs(): number {
    const byBudget = this.options.budgetMs - this.usedMs;
    const byClock = this.options.endBy === undefined ? Infinity : this.options.endBy - performance.now();
    return Math.min(byBudget, byClock);
  }

  get exhausted(): boolean {
    return this.remainingMs() < MIN_COMMAND_MS;
  }

  /**
   * The error of an episode whose tool calls' time ran out while none was running (the engine's turn, or the server's
   * work between turns, ran past `endBy`): the time was not the policy's tools', so it is not a tool-time budget
   * outcome but the run stage's deadline (deadline_exceeded: TIMEOUT), raised as soon as the turn ends instead of when
   * the stage's own deadline fires. Undefined while time is left, or when the model's calls used it up (then the episode
   * ends TRUNCATED after those calls, before another turn).
   */
  clockOutsideTools(): RolloutError | undefined {
    if (!this.exhausted || this.options.budgetMs - this.usedMs < MIN_COMMAND_MS) return undefined;
    return new RolloutError(
      'deadline_exceeded',
      `run stage timed out: the engine's turn ended with under ${MIN_COMMAND_MS} ms left for the model's tool calls, which must end by ` +
        `${this.options.endByLabel ?? 'the episode\'s end'} (${Math.round(this.usedMs)} of ${this.options.budgetMs} ms of tool time used)`,
    );
  }

  /** Charges the time one tool call took. */
  charge(ms: number): void {
    this.usedMs += Math.max(0, ms);
  }

  /** A timeout bounded by what is left (at least 1 ms: a command that starts gets a timer that fires). */
  bound(timeoutMs: number): number {
    return Math.max(1, Math.floor(Math.min(timeoutMs, this.remainingMs())));
  }
}

/**
 * A sandbox whose commands (exec and the persistent shell) time out where the tool-time budget ends; everything else
 * is the sample's sandbox itself. One per episode, so tools that key state by their sandbox (python's cells, the
 * editor's undo) keep it across the episode's calls.
 */
class BudgetedSandbox implements Sandbox {
  private budgetedShell: PersistentShell | undefined;

  constructor(
    private readonly inner: Sandbox,
    private readonly budget: ToolTimeBudget,
  ) {}

  get id(): string {
    return this.inner.id;
  }

  get spec(): SandboxSpec {
    return this.inner.spec;
  }

  get workdir(): string {
    return this.inner.workdir;
  }

  exec(argv: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
    return this.inner.exec(argv, { ...options, timeoutMs: this.budget.bound(options.timeoutMs ?? this.inner.spec.limits.commandTimeoutMs) });
  }

  spawn(argv: readonly string[], options?: SpawnOptions): SandboxProcess {
    return this.inner.spawn(argv, options);
  }

  shell(): PersistentShell {
    // Asked first so a stopped sandbox fails here as its own shell() does.
    this.inner.shell();
    const budget = this.budget;
    return (this.budgetedShell ??= {
      // The sandbox's shell is asked on each call: drivers keep one persistent shell per sandbox (and start a new one
      // after a restart), so state carries over exactly as without the budget.
      run: (command: string, options: ShellRunOptions = {}): Promise<ShellResult> =>
        this.inner.shell().run(command, { ...options, timeoutMs: budget.bound(options.timeoutMs ?? this.inner.spec.limits.commandTimeoutMs) }),
      close: () => this.inner.shell().close(),
    });
  }

  readFile(path: string, options?: FileOptions & { maxBytes?: number }): Promise<string> {
    return this.inner.readFile(path, options);
  }

  writeFile(path: string, content: string, options?: FileOptions): Promise<void> {
    return this.inner.writeFile(path, content, options);
  }

  listDir(path: string, options?: FileOptions): Promise<DirEntry[]> {
    return this.inner.listDir(path, options);
  }

  stop(): Promise<void> {
    return this.inner.stop();
  }
}
