/**
 * lmdb-js (3.5) prints every failed commit with `console.error(error)` before it rejects the writes of that commit
 * (lmdb/write.js, startWriting): a multi-line stack on stderr, outside the JSON log, once per failed batch — on a
 * failing disk, one per accept. It has no option or logger to route it. The same error reaches the journal as each
 * write's `commitError`, where it is logged once, in one line, with the stack at debug (see CommitHealth): so that
 * print, and only it (one Error argument thrown from lmdb's write.js), is dropped here. Everything else written with
 * console.error passes through unchanged. Installed once per process, by the first journal opened.
 */
let installed = false;

export function silenceLmdbCommitPrints(): void {
  if (installed) return;
  installed = true;
  const original = console.error.bind(console);
  console.error = (...args: unknown[]): void => {
    if (args.length === 1 && isLmdbCommitError(args[0])) return;
    original(...args);
  };
}

/** An Error made by lmdb-js's write thread callback: its first stack frame is in lmdb's write.js. */
function isLmdbCommitError(value: unknown): boolean {
  if (!(value instanceof Error) || typeof value.stack !== 'string') return false;
  const frame = value.stack.split('\n').find((line) => line.trimStart().startsWith('at '));
  return frame !== undefined && /[\\/]lmdb[\\/]write\.js:/.test(frame);
}
