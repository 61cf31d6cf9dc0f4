import { randomBytes } from 'node:crypto';
import { CappedOutput } from './capped-output.js';

/**
 * The wire protocol between {@link BashShell} and the bash it drives, in one place.
 *
 * The host writes three lines per command to the shell's stdin. The first prints a per-command ack line (the shell
 * began the command), runs the command with `eval` in the shell itself (so `cd`, `export` and `$?` carry over), with
 * stdin from /dev/null and stderr into stdout, and keeps its status; the second — sent right behind it, so bash
 * reads it only after the command returned — carries a fresh 128-bit nonce, reads the third line, the sentinel,
 * off stdin (see sentinelLine) and prints the end marker `<nonce>:<status>:<canary>:<shell pid>:<cwd>:<nonce>\n`.
 * The nonce is never in argv, the environment, a file or a shell variable while the command runs, so output that
 * merely contains marker-like text cannot end a command early.
 *
 * Outside the `eval`, the frame's commands write to /dev/null (a DEBUG trap or xtrace to fd 1 shows nothing of
 * them): the groups around them keep the shell's stdout on fd 0 (`0>&1 >/dev/null 2>&1`; only 0-2, whose copies
 * bash can always restore, even after `ulimit -n 3`), and the `eval` gets it back as its stdout. Bash undoes those
 * redirections after every command, so `exec >file` or `exec <file` last until the end of their command. Aliases
 * are not expanded in the frame's lines (expand_aliases is off while bash parses them), so an alias of a reserved
 * word (`case`, `for`, `{`) does not break them. Commands start with alias expansion off, as in any non-interactive
 * bash (the frame's POSIX-mode switch resets it, so `shopt -s expand_aliases` lasts one command), or on when the model
 * switched POSIX mode on.
 *
 * The command may redefine any part of the shell, including what the frame runs on (`eval() { :; }`,
 * `enable -n eval`, `ulimit -n 3`, `readonly` frame variables, a function named `printf`). So the frame
 * - looks up its builtins in POSIX mode, switched on with `declare POSIXLY_CORRECT=y` (a plain assignment to a
 *   readonly POSIXLY_CORRECT would abandon the whole frame line): there the special builtins it uses (eval, trap,
 *   unset, export) come before functions, and POSIX mode is switched back off (unless the model had it on) as the
 *   first thing inside the `eval`. A function named `declare` only takes that protection away: what it then
 *   lets through is caught by the canary;
 * - proves the command really went through the frame: the `eval`'d text first sets a per-command canary, the
 *   marker reports it and the host compares. A disabled `eval`, a redirection the shell can no longer open, a
 *   readonly frame variable all leave the canary unset, and the host restarts the shell instead of reporting the
 *   status of a command that never ran (see BashShell);
 * - treats a function named `printf`, `builtin` or `shopt` (which it needs, and which POSIX mode does not
 *   protect) as a broken frame too, found with the special builtin `export -f`.
 * The remaining assumption is spelled out in bash-shell.ts.
 */

/** SIGUSR1 makes the shell abandon the running command (see `frameCommand`); sent by the interrupter. */
export const INTERRUPT_SIGNAL = 'USR1';

/** Longest marker trailer accepted (status, pid and a cwd of at most PATH_MAX, with room to spare). */
const MAX_TRAILER_BYTES = 64 * 1024;

/** A fresh nonce per command: 32 hex digits. */
export function newNonce(): string {
  return `r${randomBytes(16).toString('hex')}`;
}

/** `text` as one bash single-quoted word. */
export function shellQuote(text: string): string {
  return `'${text.replaceAll("'", `'\\''`)}'`;
}

/**
 * The frame of one command. `previousStatus` is restored as `$?` right before the command (`(exit N) && :`, which
 * neither trips `set -e` nor an ERR trap; no helper function that could be made readonly). The trap turns SIGUSR1
 * into `break 1000`, which leaves every loop up to and including the frame's own one-shot `for`, so the rest of
 * the command is skipped and the marker is printed. Builtins are written with a backslash so that aliases cannot
 * replace them (reserved words can be aliased: expand_aliases is off while the frame is parsed); functions cannot either:
 * see the module comment. `canary` is a fresh token the host expects back in the marker. `ack`, a fresh token too,
 * is printed on a line of its own right before the command runs: it tells a shell that ended before it began the
 * command (a trap a job fired while the shell waited for input: `trap 'exit 5' USR2`) from a command that ended the
 * shell (`exit 5`). The scanner of the command removes it from the output (MarkerScanner `acked`).
 */
export function frameCommand(command: string, previousStatus: number, nonce: string, canary: string, ack?: string): string {
  const restore = previousStatus === 0 ? ':' : `(exit ${previousStatus}) && :`;
  // Still in POSIX mode: trap and unset are the real builtins. Its output (a DEBUG trap's, xtrace's) goes nowhere.
  const prologue =
    `{ \\trap 'break 1000' ${INTERRUPT_SIGNAL} && { [[ -n $__rollout_px ]] || \\unset POSIXLY_CORRECT; } && ` +
    `{ [[ -z $__rollout_px ]] || \\shopt -s expand_aliases; } && __rollout_ok=${canary}; ${restore}; } >/dev/null 2>&1\n`;
  return (
    `{ [[ -o posix ]] && __rollout_px=1 || __rollout_px=; \\declare POSIXLY_CORRECT=y; \\shopt -u expand_aliases; __rollout_ok=; ` +
    (ack === undefined ? '' : `\\builtin printf '%s\\n' ${ack} >&0; `) +
    `for __rollout_once in 1; do \\eval -- ${shellQuote(prologue + command)} >&0 </dev/null 2>&1; done; ` +
    `__rollout_ok=$?:$__rollout_ok; [[ -o posix ]] && __rollout_px=1 || __rollout_px=; ` +
    `\\declare POSIXLY_CORRECT=y; ` +
    `{ \\export -f printf || \\export -f builtin || \\export -f shopt; }; case $? in 0) \\unset -f printf builtin shopt; __rollout_ok=$__rollout_ok:function;; 1) ;; *) __rollout_ok=$__rollout_ok:unusable;; esac; ` +
    `\\shopt -u expand_aliases; } 0>&1 >/dev/null 2>&1\n` +
    `{ \\builtin read -r __rollout_line || __rollout_ok=$__rollout_ok:unusable; } >/dev/null 2>&1; ` +
    `{ [[ -n $__rollout_px ]] || \\unset POSIXLY_CORRECT || __rollout_ok=$__rollout_ok:unusable; \\shopt -u expand_aliases; ` +
    `\\builtin printf '%s:%s:%d:%s:%s\\n' ${nonce} "$__rollout_ok" "$$" "$PWD" ${nonce} >&0; } 0>&1 >/dev/null 2>&1 || ` +
    `{ \\unset -f echo; \\echo "${nonce}:$__rollout_ok:unusable:$$:$PWD:${nonce}"; }\n` +
    `${sentinelLine(nonce)}\n`
  );
}

/**
 * The line sent after each frame. The frame reads it off the shell's stdin before it prints the marker (a `read`
 * that fails, e.g. `enable -n read`, marks the frame unusable), so normally bash never parses it. A shell that
 * stopped running commands (`set -n`, or a DEBUG trap under `shopt -s extdebug` that skips them, the frame's `read`
 * included) parses it instead, and a syntax error ends a non-interactive bash at once (status 2), with the line in
 * its message on the shell's stderr: how BashShell tells this from the command's own `exit 2`.
 */
export function sentinelLine(nonce: string): string {
  return `) ${nonce}-stopped`;
}

/** What the end marker said. */
export interface Marker {
  status: number;
  pid: number;
  cwd: string;
  /**
   * Set when the frame did not run as written (see the module comment): 'not-run' (the canary was never set: the
   * command did not run at all), 'function' (the command defined a function named printf, builtin or shopt), 'unusable'
   * (the frame could not print its marker normally, e.g. out of file descriptors) — in both the status is the
   * command's — and 'tampered' (anything else: the status and cwd are not to be trusted).
   */
  broken?: 'not-run' | 'function' | 'unusable' | 'tampered';
}

/**
 * Splits the shell's stdout into the command's output (capped) and the end marker of one nonce. Bytes are
 * scanned as they come, also past the cap, so a command that prints gigabytes still ends cleanly (BashShell reads
 * past the cap only at a few MB/s: PAST_LIMIT_PAUSE_MS); only the last `nonce.length` bytes are held back while
 * looking for the marker.
 */
export class MarkerScanner {
  readonly output: CappedOutput;
  readonly nonce: string;
  private readonly start: Buffer;
  private readonly end: Buffer;
  private held = Buffer.alloc(0);
  private trailer: Buffer | undefined;
  private result: { marker: Marker; rest: Buffer } | { error: string } | undefined;
  private readonly ack: Buffer | undefined;
  /** Bytes that may be the start of the ack line, held back until the next chunk says. */
  private ackHeld = Buffer.alloc(0);
  private ackSeen = false;

  /**
   * `canary`: the token the frame must report (frameCommand); without it, markers carry no canary field. `ack`: the
   * token the frame prints when the command begins (frameCommand); its line is taken out of the output.
   */
  constructor(
    nonce: string,
    limitBytes: number,
    private readonly canary?: string,
    ack?: string,
  ) {
    this.ack = ack === undefined ? undefined : Buffer.from(`${ack}\n`);
    this.output = new CappedOutput(limitBytes);
    this.nonce = nonce;
    this.start = Buffer.from(`${nonce}:`);
    this.end = Buffer.from(`:${nonce}\n`);
  }

  /** The marker and the bytes after it, or a protocol error; undefined until the marker is complete. */
  get outcome(): { marker: Marker; rest: Buffer } | { error: string } | undefined {
    return this.result;
  }

  /** Whether the shell began the command (its ack line arrived); always true without an ack. */
  get acked(): boolean {
    return this.ack === undefined || this.ackSeen;
  }

  push(chunk: Buffer): void {
    if (this.ack === undefined || this.ackSeen || this.result) return this.scan(chunk);
    const data = this.ackHeld.length > 0 ? Buffer.concat([this.ackHeld, chunk]) : chunk;
    const at = data.indexOf(this.ack);
    if (at >= 0) {
      this.ackSeen = true;
      this.ackHeld = Buffer.alloc(0);
      return this.scan(Buffer.concat([data.subarray(0, at), data.subarray(at + this.ack.length)]));
    }
    // Hold back only a tail that could begin the ack line (never a marker's closing newline: the ack starts with 'r').
    let keep = Math.min(data.length, this.ack.length - 1);
    while (keep > 0 && !this.ack.subarray(0, keep).equals(data.subarray(data.length - keep))) keep--;
    this.ackHeld = Buffer.from(data.subarray(data.length - keep));
    this.scan(data.subarray(0, data.length - keep));
  }

  private scan(chunk: Buffer): void {
    if (this.result) {
      // Bytes after the marker (background jobs) until the owner detaches: kept, within the cap.
      if ('rest' in this.result && this.result.rest.length < this.output.limitBytes) this.result.rest = Buffer.concat([this.result.rest, chunk]);
      return;
    }
    if (this.trailer === undefined) {
      const data = this.held.length > 0 ? Buffer.concat([this.held, chunk]) : chunk;
      const at = data.indexOf(this.start);
      if (at < 0) {
        const keep = Math.min(data.length, this.start.length - 1);
        this.output.push(data.subarray(0, data.length - keep));
        this.held = Buffer.from(data.subarray(data.length - keep));
        return;
      }
      this.output.push(data.subarray(0, at));
      this.held = Buffer.alloc(0);
      this.trailer = Buffer.from(data.subarray(at + this.start.length));
    } else {
      this.trailer = Buffer.concat([this.trailer, chunk]);
    }
    const close = this.trailer.indexOf(this.end);
    if (close < 0) {
      if (this.trailer.length > MAX_TRAILER_BYTES) this.result = { error: 'end marker without an end' };
      return;
    }
    const trailer = this.trailer.subarray(0, close).toString('utf8');
    const rest = this.trailer.subarray(close + this.end.length);
    if (this.canary === undefined) {
      const fields = /^(\d{1,3}):(\d{1,10}):([\s\S]*)$/.exec(trailer);
      this.result = fields ? { marker: { status: Number(fields[1]), pid: Number(fields[2]), cwd: fields[3]! }, rest } : { error: 'malformed end marker' };
      return;
    }
    // Anything but `<status>:<canary>[:function|:unusable]:<pid>:<cwd>` (the frame's own "broken" report, a canary never set,
    // a readonly frame variable) means the frame did not run as written: a marker that says so.
    const fields = /^(\d{1,3}):([^:]*)(:function|:unusable)?:(\d{1,10}):([\s\S]*)$/.exec(trailer);
    const marker: Marker | undefined = fields ? { status: Number(fields[1]), pid: Number(fields[4]), cwd: fields[5]! } : undefined;
    if (marker && fields![2] === '') marker.broken = 'not-run';
    else if (marker && fields![2] !== this.canary) marker.broken = 'tampered';
    else if (marker && fields![3] !== undefined) marker.broken = fields![3] === ':function' ? 'function' : 'unusable';
    this.result = { marker: marker ?? { status: 0, pid: 0, cwd: '', broken: 'tampered' }, rest };
  }

  /** Moves what was held back into the output (the shell ended without a marker). */
  flush(): void {
    if (this.ackHeld.length > 0) {
      const held = this.ackHeld;
      this.ackHeld = Buffer.alloc(0);
      this.scan(held);
    }
    if (this.trailer === undefined && this.held.length > 0) this.output.push(this.held);
    this.held = Buffer.alloc(0);
  }

  /** The output as text (invalid UTF-8 becomes U+FFFD) with a visible note when bytes were dropped. */
  text(): string {
    const text = this.output.text();
    if (!this.output.truncated) return text;
    return `${text}${text.endsWith('\n') || text === '' ? '' : '\n'}[output truncated: ${this.output.droppedBytes} bytes dropped]`;
  }
}
