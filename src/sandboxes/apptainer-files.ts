import { RolloutError } from '../errors.js';
import { killedFileOperation, readNonblock, replaceFileScript } from './sandbox-files.js';

/**
 * File operations of the Apptainer driver, done by small POSIX sh scripts run inside the instance (as the
 * sandbox's user, through its mounts), never through host paths: the workspace is a host dir, but a program can
 * plant symlinks in it, and inside the instance a symlink can only lead to what the sandbox may see anyway.
 *
 * Each script reports a problem by a distinct exit code (below) before touching anything; paths are positional
 * parameters, never spliced into the script. Needs sh, cat, head, wc, mkdir, dirname and GNU find (-printf) in the
 * image: Debian's required packages; writes replace the file whole with mktemp, stat, readlink and mv where the image
 * has them (else in place, as before).
 */
export const FILE_EXIT = { missing: 3, notFile: 4, tooLarge: 5, notDir: 6, changed: 7 } as const;

/**
 * argv: path, maxBytes. Prints the file's bytes, to a little past maxBytes at most (whole pages: /proc/self/pagemap
 * refuses reads of other sizes), in one open: the caller refuses more than maxBytes. A pseudo-file stats as 0 bytes and
 * may be endless, and a path the program swaps for a symlink to /dev/zero after the check is read no further either.
 * O_NONBLOCK where GNU dd is there, and refused unless the path stayed the same regular file (readNonblock): a FIFO put
 * at the path after the check must not block the open until the command timeout, which would be reported as
 * deadline_exceeded, an infrastructure failure.
 */
export const READ_FILE_SCRIPT = [
  'p=$1; max=$2',
  `[ -e "$p" ] || exit ${FILE_EXIT.missing}`,
  `[ -f "$p" ] || exit ${FILE_EXIT.notFile}`,
  'n=$(((max / 4096 + 1) * 4096))',
  readNonblock(FILE_EXIT.notFile, FILE_EXIT.changed),
  'exec head -c "$n" -- "$p"',
].join('\n');

/**
 * argv: path. Writes stdin to the file, creating its parents: to a new file beside it, renamed over it once all is
 * written, so a write that fails part way leaves the old content (replaceFileScript, shared with bubblewrap; no init
 * here: GNU dd's O_NONBLOCK, else cat).
 */
export const WRITE_FILE_SCRIPT = [
  'p=$1; i=',
  `[ -d "$p" ] && exit ${FILE_EXIT.notFile}`,
  `[ -e "$p" ] && [ ! -f "$p" ] && exit ${FILE_EXIT.notFile}`,
  'mkdir -p -- "$(dirname -- "$p")" || exit 1',
  replaceFileScript({ notRegular: FILE_EXIT.notFile, isDir: FILE_EXIT.notFile }),
].join('\n');

/** argv: path. Prints one NUL-terminated `<type> <size> <name>` record per entry (find's %y: f, d, l, ...). */
export const LIST_DIR_SCRIPT = [
  'p=$1',
  `[ -e "$p" ] || exit ${FILE_EXIT.missing}`,
  `[ -d "$p" ] || exit ${FILE_EXIT.notDir}`,
  `exec find "$p" -mindepth 1 -maxdepth 1 -printf '%y %s %f\\0'`,
].join('\n');

/**
 * Maps a file script's outcome to the error the Sandbox contract names (null: success). `killedBy`: the signal that
 * killed it (apptainer exec reports one as exit code 128 + N), an infrastructure failure, never the path's fault.
 */
export function fileScriptError(
  op: 'readFile' | 'writeFile' | 'listDir',
  path: string,
  r: { exitCode: number | null; killedBy: string | null; stderr: string },
  maxBytes?: number,
): RolloutError | null {
  const { exitCode, stderr } = r;
  if (exitCode === 0) return null;
  if (exitCode === null || r.killedBy !== null) return killedFileOperation(path, r.killedBy, stderr);
  switch (exitCode) {
    case FILE_EXIT.missing:
      return new RolloutError('not_found', `no such file: ${path}`);
    case FILE_EXIT.notFile:
      return RolloutError.invalid('path', `${path} is not a regular file`);
    case FILE_EXIT.notDir:
      return RolloutError.invalid('path', `${path} is not a directory`);
    case FILE_EXIT.changed:
      return RolloutError.invalid('path', `${path} was replaced while it was read (by the sandbox's own processes)`);
    case FILE_EXIT.tooLarge:
      return RolloutError.invalid('path', `${path} is over the ${maxBytes ?? '?'}-byte read limit`);
    default:
      return RolloutError.invalid('path', `${op} ${path} failed (exit code ${exitCode}): ${stderr.trim().slice(0, 500)}`);
  }
}
