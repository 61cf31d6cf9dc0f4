import { constants as osConstants } from 'node:os';

/**
 * The signals that stop a long CLI command: Ctrl-C, a `kill`, and the terminal hanging up (the window closed, the ssh
 * session dropped, no nohup). SIGHUP's default action kills node at once: a `submit` lost its Parquet output and left
 * a torn line, an `image build` left its work dir (and debootstrap's mounts inside it), a `demo` its sandboxes.
 */
export const STOP_SIGNALS: readonly NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];

/** The exit status of a process ended by `signal` (128 + its number: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP). */
export function signalExitCode(signal: NodeJS.Signals): number {
  return 128 + (osConstants.signals[signal] ?? 0);
}

/**
 * A terminal that hung up (EIO: the window closed — SIGHUP is on its way) or a reader gone (EPIPE: `rollout ... | head`)
 * ends what the command prints, not its cleanup: unhandled, the write's error killed the process mid-cleanup.
 */
function ignoreGoneReader(err: NodeJS.ErrnoException): void {
  if (err.code !== 'EIO' && err.code !== 'EPIPE') throw err;
}

/**
 * Drops write errors of a terminal that hung up or a reader gone on stdout and stderr, for the rest of the process's
 * life (the error of the last line written arrives after the command returned). Idempotent.
 */
export function ignoreGoneTerminal(): void {
  for (const stream of [process.stdout, process.stderr]) {
    if (!stream.listeners('error').includes(ignoreGoneReader)) stream.on('error', ignoreGoneReader);
  }
}

/**
 * SIGINT, SIGTERM and SIGHUP while a command runs: the first calls `stop` (the command winds down: its cleanup runs and
 * it returns {@link exitCode}); a second SIGINT or SIGTERM calls `again` — by default the process exits at once with
 * that signal's status, cleanup or not. A repeated SIGHUP is ignored: a hang-up comes more than once (an interactive
 * shell passes its SIGHUP on, the kernel sends another as the shell exits), and it is nobody insisting on an exit
 * without the cleanup. {@link dispose} removes the handlers (the signals' default actions return).
 */
export class StopSignals {
  #signal: NodeJS.Signals | undefined;
  readonly #onSignal = (name: NodeJS.Signals): void => {
    if (this.#signal === undefined) {
      this.#signal = name;
      this.stop(name);
      return;
    }
    if (name === 'SIGHUP') return;
    if (this.again !== undefined) this.again(name);
    else process.exit(signalExitCode(name));
  };

  constructor(
    private readonly stop: (name: NodeJS.Signals) => void,
    private readonly again?: (name: NodeJS.Signals) => void,
  ) {
    for (const name of STOP_SIGNALS) process.on(name, this.#onSignal);
  }

  /** The first signal that came, if any. */
  get signal(): NodeJS.Signals | undefined {
    return this.#signal;
  }

  /** The exit code the first signal asks for (128 + its number), once one came. */
  get exitCode(): number | undefined {
    return this.#signal === undefined ? undefined : signalExitCode(this.#signal);
  }

  dispose(): void {
    for (const name of STOP_SIGNALS) process.off(name, this.#onSignal);
  }
}
