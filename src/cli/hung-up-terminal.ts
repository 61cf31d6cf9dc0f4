import { closeSync } from 'node:fs';
import { isatty } from 'node:tty';

/**
 * Lets a `rollout` process whose terminal hung up (the window closed, the ssh session dropped: `serve` and `demo`
 * take the SIGHUP and drain) exit with its own exit code. At exit, node restores the terminal modes of stdin, stdout
 * and stderr when they were terminals at its start, and aborts when that fails (`Assertion failed` in
 * node::ResetStdio, fixed in node 24 by nodejs/node#58200; node 20 and 22 abort): a hung-up terminal fails it with
 * EIO, so the drain ran to its end and the process still died of SIGABRT (or SIGSEGV) with a core dump instead of
 * exiting 0 (or 129 for the demo). On 'exit' (after every write), each of fds 0–2 that was a terminal at start and
 * is not one any more — a hung-up terminal answers EIO to the isatty check — is closed, so node finds nothing to
 * restore (it skips a closed fd). A terminal still there is left alone and restored as usual.
 */
export function exitCleanlyAfterHangup(): void {
  const wasTerminal = [0, 1, 2].filter((fd) => isatty(fd));
  if (wasTerminal.length === 0) return;
  process.once('exit', () => {
    for (const fd of wasTerminal) {
      if (isatty(fd)) continue;
      try {
        closeSync(fd);
      } catch {
        // already closed
      }
    }
  });
}
