import { RolloutError } from '../errors.js';
import { resolveInSandbox } from './bwrap-command.js';
import type { DirEntry } from './types.js';

/** Default largest file `readFile` returns. */
export const DEFAULT_MAX_READ_BYTES = 16 * 1024 * 1024;

/**
 * Largest directory listing `listDir` reads (~10,000 entries of typical names). A listing is parsed and sorted on the
 * server's event loop: a model that fills a directory with 600,000 files (one shell loop) made one `view` of it block
 * the loop for ~5 s under the old 16 MiB cap. A larger directory is refused: the tools show the first 200 entries anyway.
 */
export const MAX_LIST_BYTES = 256 * 1024;

/** What file operations need of a sandbox: run a small shell script inside it, as its user, with a byte cap. */
export type RunInside = (
  argv: readonly string[],
  options: { stdin?: string; signal?: AbortSignal; outputLimitBytes: number },
) => Promise<{ exitCode: number | null; signal: string | null; stdout: string; stderr: string; truncated: boolean; timedOut: boolean }>;

// Exit codes of the scripts below; anything else is the tool's own failure (EACCES, EROFS, ENOSPC, ...).
const NOT_FOUND = 20;
const IS_DIR = 21;
const NOT_REGULAR = 22;
const NOT_DIR = 24;
const CHANGED = 25;

/**
 * The read of a file script (`$p`, `$n` bytes at most) where the image has GNU dd and stat: opened with O_NONBLOCK
 * (no effect on a regular file), so a FIFO the program put at the path after the script's check cannot block the open
 * until the command timeout (deadline_exceeded, an infrastructure failure, for the program's own doing). What was read
 * counts only if the path is, after the read, the very regular file (type, device and inode in one stat) it was
 * before the open, and what was read fits the file it is then (no more bytes than its size, none only if it is empty):
 * else exit `changed` (or `notRegular`), never a FIFO's nothing passed off as the file's content (not checked on proc
 * and sysfs, which hold no FIFO and where /proc/self is another file to each process). Identity alone did not hold
 * (review s38): a file moved away and back around the read (a FIFO at the path meanwhile) is the same inode, and a
 * FIFO replaced by a new one gets the freed inode number on ext4, which a separate `[ -f ]` then saw as the file. A
 * file appended to while it is read still reads (a prefix of what it then holds). dd killed by a signal
 * kills the script with it, as an `exec` would (the driver tells a killed reader from the path's fault). Shared by
 * both drivers' scripts; falls through (to their `head`) without GNU dd.
 */
export function readNonblock(notRegular: number, changed: number): string {
  return [
    // Type, device and inode in one stat: a `[ -f ]` then a stat are two looks, each at whatever the path is then.
    'if dd if=/dev/null iflag=nonblock,count_bytes count=0 status=none 2>/dev/null && id=$(LC_ALL=C stat -L -c %F:%d:%i -- "$p" 2>/dev/null); then',
    `  case $id in 'regular file:'*|'regular empty file:'*) ;; *) exit ${notRegular} ;; esac`,
    // A pseudo-file system the program cannot put a FIFO in: no check (/proc/self/... is another file to each process).
    '  case $(stat -f -L -c %T -- "$p" 2>/dev/null) in proc|sysfs) exec dd if="$p" iflag=nonblock,count_bytes bs=65536 count="$n" status=none ;; esac',
    // dd's report (stderr, C locale) ends with "<bytes> bytes copied, ...": kept, the data goes to the script's stdout.
    '  { r=$(LC_ALL=C dd if="$p" iflag=nonblock,count_bytes bs=65536 count="$n" 2>&1 >&3); } 3>&1; s=$?',
    '  [ "$s" -gt 128 ] && kill -s "$(kill -l "$s")" $$',
    '  [ "$s" = 0 ] || { printf \'%s\\n\' "$r" >&2; exit "$s"; }',
    `  z=$(LC_ALL=C stat -L -c %F:%d:%i:%s -- "$p" 2>/dev/null) && [ "\${z%:*}" = "$id" ] || exit ${changed}`,
    '  b=${r##*\n}; b=${b%% *}; z=${z##*:}',
    `  case $b in ''|*[!0-9]*) exit ${changed} ;; esac`,
    `  [ "$b" -le "$z" ] && { [ "$b" -gt 0 ] || [ "$z" = 0 ]; } || exit ${changed}`,
    '  exit 0',
    'fi',
  ].join('\n');
}

/**
 * The write of writeFile once the path is checked (absent or a regular file, its directory made), shared by both
 * drivers' scripts: `$p` the path, `$i` the sandbox init inside the sandbox (empty without one). The content goes to a
 * new file beside the file the path names (mktemp: O_EXCL, so nothing the program planted is opened) and is renamed
 * over it only once all of it is written: a write that fails part way — the file size limit (SIGXFSZ), a full tmpfs
 * (ENOSPC), a killed writer — leaves the old content as it was, never a truncated file for the program's later commands
 * and the evaluation to see (review s40). The partial copy is removed (a writer killed with the whole command leaves a
 * hidden `.rollout-write.*` beside the file), and a writer killed by a signal kills the script with it, as an `exec`
 * would: the driver tells a killed writer from the path's fault.
 *
 * What the path names is what is replaced: a symlink is resolved first (readlink -f, inside the sandbox's own root,
 * so it can only lead to what the sandbox's user may write anyway) and stays a symlink; the new file gets the old
 * one's permission bits (a new one 0666 less the umask, as a shell's `>`). Written in place as before, where
 * replacing would change more than the content, or cannot be done: a file of another owner (the sandbox's user cannot
 * give it back), one with other hard links (they would keep the old content), one the user may not write (refused as
 * before, EACCES, not replaced behind its mode), a directory the user cannot create a file in, a file that cannot be
 * renamed over (one bound into the sandbox: EBUSY), a symlink readlink cannot resolve (a dangling one fails there as it
 * did), an image without mktemp. The writer opens with O_NONBLOCK (the init's `--write-file`, else GNU dd's), so a FIFO
 * put at the path in between fails (ENXIO) instead of blocking; without either, `cat`.
 */
export function replaceFileScript(codes: { notRegular: number; isDir: number }): string {
  return [
    'w() {',
    `  if [ -n "$i" ]; then "$i" --write-file ${codes.notRegular} "$1"`,
    '  elif dd of=/dev/null oflag=nonblock count=0 status=none </dev/null 2>/dev/null; then dd of="$1" oflag=nonblock bs=65536 status=none',
    '  else cat > "$1"; fi',
    '}',
    // The writer's status; one killed by a signal kills the script with it.
    'fail() { [ -z "$tmp" ] || rm -f -- "$tmp"; [ "$1" -gt 128 ] && kill -s "$(kill -l "$1")" $$; exit "$1"; }',
    'tmp=',
    'inplace() { w "$1"; s=$?; [ "$s" = 0 ] || fail "$s"; exit 0; }',
    't=$p',
    'if [ -L "$p" ]; then t=$(readlink -f -- "$p" 2>/dev/null) && [ -n "$t" ] || inplace "$p"; fi',
    'td=${t%/*}; [ -n "$td" ] || td=/',
    'if [ -e "$t" ] && { [ ! -O "$t" ] || [ ! -w "$t" ] || [ "$(stat -c %h -- "$t" 2>/dev/null)" != 1 ]; }; then inplace "$t"; fi',
    'tmp=$(mktemp "$td/.rollout-write.XXXXXX" 2>/dev/null) || { tmp=; inplace "$t"; }',
    'w "$tmp"; s=$?; [ "$s" = 0 ] || fail "$s"',
    'if [ -e "$t" ]; then m=$(stat -c %a -- "$t" 2>/dev/null); else m=$(printf %o $((0666 & ~0$(umask)))); fi',
    '[ -z "$m" ] || chmod "$m" "$tmp" || fail 1',
    'mv -fT -- "$tmp" "$t" 2>/dev/null && exit 0',
    `[ -d "$t" ] && { rm -f -- "$tmp"; exit ${codes.isDir}; }`,
    'w "$t" < "$tmp"; s=$?; [ "$s" = 0 ] || fail "$s"',
    'rm -f -- "$tmp"',
  ].join('\n');
}

/**
 * One open, one pass: up to the limit rounded up to whole pages past it (/proc/self/pagemap refuses reads of other
 * sizes), so the host sees more than the limit exactly when the file is over it. $3: the sandbox init binary inside the
 * sandbox (empty without one; $2 of WRITE likewise), whose `--read-file` opens with O_NONBLOCK and refuses what is not
 * a regular file once opened (fstat); else GNU dd's O_NONBLOCK and the identity check around it (readNonblock); else
 * head. See SandboxFiles.
 */
const READ = `p=$1
[ -d "$p" ] && exit ${IS_DIR}
[ -e "$p" ] || exit ${NOT_FOUND}
[ -f "$p" ] || exit ${NOT_REGULAR}
n=$((($2 / 4096 + 1) * 4096))
[ -n "$3" ] && exec "$3" --read-file ${NOT_REGULAR} "$n" "$p"
${readNonblock(NOT_REGULAR, CHANGED)}
exec head -c "$n" -- "$p"`;
/** $2: the sandbox init inside the sandbox (empty without one). See replaceFileScript. */
const WRITE = `p=$1; i=$2; d=\${p%/*}; [ -n "$d" ] || d=/
[ -d "$p" ] && exit ${IS_DIR}
[ -e "$p" ] && [ ! -f "$p" ] && exit ${NOT_REGULAR}
mkdir -p -- "$d" || exit 1
[ -d "$d" ] || exit ${NOT_DIR}
${replaceFileScript({ notRegular: NOT_REGULAR, isDir: IS_DIR })}`;
/** $2: the sandbox init inside the sandbox (empty without one), whose `--list-dir` needs no GNU find (busybox's lacks -printf). */
const LIST = `p=$1
[ -e "$p" ] || exit ${NOT_FOUND}
[ -d "$p" ] || exit ${NOT_DIR}
[ -n "$2" ] && exec "$2" --list-dir "$p"
exec find "$p" -mindepth 1 -maxdepth 1 -printf '%y %s %f\\0'`;

/**
 * File access to a running sandbox. Every operation is a short script run inside the sandbox as its own user, so
 * paths resolve in the sandbox's root and with its permissions: a symlink the program planted can only point at
 * something inside the sandbox (an absolute `/etc/x` is the sandbox's /etc), and a read-only path stays read-only.
 * Why not host paths through /proc/PID/root: the host kernel would follow absolute symlinks on the host. Needs
 * /bin/sh, cat, head, wc and mkdir in the sandbox's root, and GNU find where the sandbox has no init (every Debian image has them).
 *
 * Reads and writes open their file with O_NONBLOCK where the image has GNU dd (iflag/oflag=nonblock; no effect on a
 * regular file): the path is checked to be a regular file and then opened, and a FIFO the program puts there in
 * between must not block the open until the command timeout — deadline_exceeded, an infrastructure failure, for what
 * the program did in its own sandbox. Such a FIFO fails the write (ENXIO: no reader), and a read whose path did not
 * stay the same regular file is refused (readNonblock): observations. Both go through the sandbox init's `--read-file`
 * and `--write-file` instead wherever the sandbox has it (`init`: bubblewrap with the init built), which need no tool of
 * the image: an image without GNU dd (busybox) has none that opens without blocking. Without either, `head` and `cat`
 * open the file, with that window.
 *
 * A file is read once, to a little past the limit at most (whole pages), never all of it: a pseudo-file stats as 0
 * bytes and may be endless (reading /proc/self/pagemap through took the whole command timeout), and a path the program
 * swaps for a symlink to /dev/zero after the check is read no further either. More than the limit is refused.
 */
export class SandboxFiles {
  /** `init`: path inside the sandbox of the sandbox init binary (`--read-file`, `--write-file`), when the sandbox has one. */
  constructor(private readonly workdir: string, private readonly run: RunInside, private readonly init?: string) {}

  async read(path: string, options: { signal?: AbortSignal; maxBytes?: number } = {}): Promise<string> {
    const abs = this.resolve(path);
    const maxBytes = options.maxBytes ?? DEFAULT_MAX_READ_BYTES;
    const r = await this.run(['/bin/sh', '-c', READ, 'read', abs, String(maxBytes), this.init ?? ''], { ...signalOf(options), outputLimitBytes: maxBytes });
    // More than maxBytes came (the script reads a little past it): the file is over the limit.
    if (r.truncated && r.exitCode === 0) throw RolloutError.invalid('path', `${path} is over the ${maxBytes}-byte read limit`);
    check(r, path);
    return r.stdout;
  }

  async write(path: string, content: string, options: { signal?: AbortSignal } = {}): Promise<void> {
    const abs = this.resolve(path);
    if (abs === '/') throw RolloutError.invalid('path', `${path} is a directory`);
    const r = await this.run(['/bin/sh', '-c', WRITE, 'write', abs, this.init ?? ''], { stdin: content, ...signalOf(options), outputLimitBytes: 4096 });
    check(r, path);
  }

  async list(path: string, options: { signal?: AbortSignal } = {}): Promise<DirEntry[]> {
    const abs = this.resolve(path);
    const r = await this.run(['/bin/sh', '-c', LIST, 'list', abs, this.init ?? ''], { ...signalOf(options), outputLimitBytes: MAX_LIST_BYTES });
    if (!r.truncated) check(r, path);
    return parseDirListing(r.stdout, path, r.truncated);
  }

  private resolve(path: string): string {
    if (typeof path !== 'string' || path === '') throw RolloutError.invalid('path', 'must be a non-empty string');
    if (path.includes('\0')) throw RolloutError.invalid('path', 'contains a NUL byte');
    return resolveInSandbox(this.workdir, path);
  }
}

/**
 * Parses a listing of `find -printf '%y %s %f\\0'` records (f, d, l, ...; sizes for files only), sorted by name in
 * code-unit order; both drivers' listings. Throws invalid_argument when the listing was cut at MAX_LIST_BYTES (the
 * directory is too large to list), sandbox_error on a record of another shape.
 */
export function parseDirListing(stdout: string, path: string, truncated: boolean): DirEntry[] {
  if (truncated) throw RolloutError.invalid('path', `${path} has too many entries to list (over ${MAX_LIST_BYTES >> 10} KiB of names); use bash, e.g. ls | head`);
  const out: DirEntry[] = [];
  for (const record of stdout.split('\0')) {
    if (record === '') continue;
    const match = /^(\S) (\d+) ([\s\S]+)$/.exec(record);
    if (!match) throw new RolloutError('sandbox_error', `listDir: unexpected record ${JSON.stringify(record.slice(0, 100))}`);
    const [, kind, size, name] = match as unknown as [string, string, string, string];
    const type: DirEntry['type'] = kind === 'f' ? 'file' : kind === 'd' ? 'dir' : kind === 'l' ? 'symlink' : 'other';
    out.push({ name, type, size: type === 'file' ? Number(size) : 0 });
  }
  return out.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

function signalOf(options: { signal?: AbortSignal }): { signal?: AbortSignal } {
  return options.signal === undefined ? {} : { signal: options.signal };
}

function check(r: Awaited<ReturnType<RunInside>>, path: string): void {
  if (r.timedOut) throw new RolloutError('deadline_exceeded', `file operation on ${path} timed out`);
  // Killed by a signal (the OOM killer of a memory limit the sandbox is not at, a kill from outside): nothing about the
  // path, so never invalid_argument. The driver has already turned the sandbox's own limit into SandboxLimitError.
  if (r.exitCode === null) throw killedFileOperation(path, r.signal, r.stderr);
  switch (r.exitCode) {
    case 0:
      return;
    case NOT_FOUND:
      throw new RolloutError('not_found', `no such file or directory: ${path}`);
    case IS_DIR:
      throw RolloutError.invalid('path', `${path} is a directory`);
    case NOT_REGULAR:
      throw RolloutError.invalid('path', `${path} is not a regular file`);
    case NOT_DIR:
      throw RolloutError.invalid('path', `${path} (or a parent) is not a directory`);
    case CHANGED:
      throw RolloutError.invalid('path', `${path} was replaced while it was read (by the sandbox's own processes)`);
    default:
      throw RolloutError.invalid('path', `${path}: ${r.stderr.trim().split('\n').pop() ?? `exit ${r.exitCode}`}`);
  }
}

/**
 * A file operation whose process was killed by a signal: an infrastructure failure (sandbox_error) with the signal and
 * what the process printed as its cause. Shared by both drivers.
 */
export function killedFileOperation(path: string, signal: string | null, stderr: string): RolloutError {
  const how = `killed by ${signal ?? 'a signal'}`;
  const detail = stderr.trim().slice(-500);
  return new RolloutError('sandbox_error', `file operation on ${path} failed: its process was ${how}`, {
    cause: new Error(`the file operation's process was ${how}${detail === '' ? '' : `: ${detail}`}`),
  });
}
