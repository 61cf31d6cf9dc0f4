import { randomBytes } from 'node:crypto';
import { CappedOutput } from './capped-output.js';

/**
 * The wire protocol between {@link BashShell} and the bash it drives, in one place.
 *
 * The host writes one frame per command to the shell's stdin: a single line that runs the command with
 * `eval` in the shell itself (so `cd`, `export` and `$?` carry over), with stdin from /dev/null and stderr
 * into stdout, then reads the next stdin line — a fresh 128-bit nonce the host sends right behind the frame —
 * and prints the end marker `<nonce>:<status>:<shell pid>:<cwd>:<nonce>\n`. The nonce is never in argv, the
 * environment, a file or a shell variable while the command runs (it is read only after the command returned,
 * and unset right after printing), so output that merely contains marker-like text cannot end a command early.
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
 * The frame of one command. `previousStatus` is restored as `$?` before the command runs (through a function,
 * no fork). The trap turns SIGUSR1 into `break 1000`, which leaves every loop up to and including the frame's
 * own one-shot `for`, so the rest of the command is skipped and the marker is printed. Builtins are written
 * with a backslash so that aliases the user defined cannot replace them.
 */
export function frameCommand(command: string, previousStatus: number, nonce: string): string {
  return (
    `\\trap 'break 1000' ${INTERRUPT_SIGNAL}; __rollout_status() { return "$1"; }; ` +
    `for __rollout_once in 1; do __rollout_status ${previousStatus}; \\eval -- ${shellQuote(command)} </dev/null 2>&1; done; ` +
    `__rollout_rc=$?; IFS= \\read -r __rollout_n; ` +
    `\\printf '%s:%d:%d:%s:%s\\n' "$__rollout_n" "$__rollout_rc" "$$" "$PWD" "$__rollout_n"; \\unset __rollout_n\n` +
    `${nonce}\n`
  );
}

/** What the end marker said. */
export interface Marker {
  status: number;
  pid: number;
  cwd: string;
}

/**
 * Splits the shell's stdout into the command's output (capped) and the end marker of one nonce. Bytes are
 * scanned as they come, also past the cap, so a command that prints gigabytes still ends cleanly; only the
 * last `nonce.length` bytes are held back while looking for the marker.
 */
export class MarkerScanner {
  readonly output: CappedOutput;
  private readonly start: Buffer;
  private readonly end: Buffer;
  private held = Buffer.alloc(0);
  private trailer: Buffer | undefined;
  private result: { marker: Marker; rest: Buffer } | { error: string } | undefined;

  constructor(nonce: string, limitBytes: number) {
    this.output = new CappedOutput(limitBytes);
    this.start = Buffer.from(`${nonce}:`);
    this.end = Buffer.from(`:${nonce}\n`);
  }

  /** The marker and the bytes after it, or a protocol error; undefined until the marker is complete. */
  get outcome(): { marker: Marker; rest: Buffer } | { error: string } | undefined {
    return this.result;
  }

  push(chunk: Buffer): void {
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
    const fields = /^(\d{1,3}):(\d{1,10}):([\s\S]*)$/.exec(this.trailer.subarray(0, close).toString('utf8'));
    this.result = fields
      ? { marker: { status: Number(fields[1]), pid: Number(fields[2]), cwd: fields[3]! }, rest: this.trailer.subarray(close + this.end.length) }
      : { error: 'malformed end marker' };
  }

  /** Moves what was held back into the output (the shell ended without a marker). */
  flush(): void {
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
