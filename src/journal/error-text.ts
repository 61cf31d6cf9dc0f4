import { getSystemErrorName } from 'node:util';

/**
 * One-line texts for the journal's failures: what a client, the log and an operator are told. Shared by the journal,
 * its commit health and start-up recovery, so a cause reads the same wherever it is reported.
 */

/** An error's message (anything else thrown, as a string): the text of a cause, without its stack. */
export function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * The cause of a failed journal write in one line, e.g. `EIO (input/output error)`: the errno's name and its text,
 * never a stack. lmdb-js reports a system error as an Error whose message is strerror's text and whose `code` is the
 * errno as a number; its own errors say `MDB_MAP_FULL: ...`; Node's say `ENOSPC: ...` with a string code.
 */
export function writeFailureText(err: unknown): string {
  const e = err as { code?: unknown; message?: unknown } | null | undefined;
  const message = String(e?.message ?? err).split('\n')[0]!;
  const named = /^([A-Z][A-Z0-9_]+): (.*)$/.exec(message);
  if (named) return `${named[1]} (${lower(named[2]!)})`;
  let name: string | undefined;
  if (typeof e?.code === 'string' && /^E[A-Z0-9]+$/.test(e.code)) name = e.code;
  else if (typeof e?.code === 'number' && e.code > 0) {
    try {
      name = getSystemErrorName(-e.code);
    } catch {
      name = undefined; // not an errno
    }
  }
  return name === undefined || name.startsWith('Unknown') ? message : `${name} (${lower(message)})`;
}

function lower(text: string): string {
  return text.charAt(0).toLowerCase() + text.slice(1);
}
