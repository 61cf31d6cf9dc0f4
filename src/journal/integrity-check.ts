import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';

/**
 * What an operator is told to do with a damaged journal, and what that costs. The journal is the durable copy of
 * accepted work, not the only copy of anything a trainer cannot send again.
 */
export function damagedAdvice(dir: string): string {
  return (
    `move the journal directory aside (e.g. mv ${dir} ${dir}.damaged) and start the server again: it starts with an empty journal. ` +
    'Lost with it: the tasks it had accepted and not finished or not yet delivered (their trainers must submit them again), ' +
    'finished trajectories not yet acknowledged, and the recorded weight-sync state'
  );
}

/** LMDB's own errors for pages that are not what they should be (a damaged file), as lmdb-js words them. */
export function isDamaged(err: unknown): boolean {
  return /MDB_CORRUPTED|MDB_PAGE_NOTFOUND|MDB_INVALID|MDB_VERSION_MISMATCH|MDB_BAD_TXN|MDB_BAD_VALSIZE/.test(String((err as { message?: unknown } | undefined)?.message ?? err));
}

/** The walk the check process runs: every key and value, as raw bytes (what opening and loading the journal reads). */
const WALK = `
const { open } = require(process.argv[1]);
const db = open({ path: process.argv[2], compression: false, readOnly: true });
let n = 0;
for (const key of db.getKeys()) { db.getBinary(key); n++; }
process.stdout.write(String(n));
`;

/**
 * Reads the whole of an existing journal in a child process before the server reads it. LMDB trusts its pages: one
 * with garbage in it (a disk fault, a bad copy) can send a reader through a wild pointer, and the server would die of
 * SIGSEGV (or abort) with no word about why. A child that dies that way, or that LMDB told of a damaged page
 * (MDB_CORRUPTED, MDB_PAGE_NOTFOUND: this process's reads take other paths through the same pages, where the damage
 * may be a wild pointer instead), costs nothing but its own life: the start is refused naming the file and what to
 * do. Any other error lets the open go on (it reports the error itself, or quarantines a record that does not
 * decode). Synchronous: start-up only, before anything listens. Bounded: a check that outlives its time (a huge
 * journal on a slow disk) is given up with a warning, and the open goes on as before.
 *
 * Not covered: LMDB's free-page list is read only when a later write needs pages, so garbage there can still end the
 * process at its first writes.
 */
export function checkJournalReadable(dir: string, file: string, sizeBytes: number, log: Logger): void {
  const lmdb = createRequire(import.meta.url).resolve('lmdb');
  // A page cache-cold read of the whole file at a slow 20 MiB/s, plus a node start-up.
  const timeout = 30_000 + Math.ceil(sizeBytes / (20 << 20)) * 1_000;
  const started = Date.now();
  const result = spawnSync(process.execPath, ['-e', WALK, lmdb, dir], { encoding: 'utf8', timeout, stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 1 << 20 });
  if ((result.error as NodeJS.ErrnoException | undefined)?.code === 'ETIMEDOUT') {
    log.warn({ file, timeoutMs: timeout }, 'journal integrity check took too long: skipped (a damaged page may still end the process while the journal is read)');
    return;
  }
  if (result.error) {
    log.warn({ file, reason: result.error.message }, 'journal integrity check could not run: skipped');
    return;
  }
  if (result.signal !== null) {
    throw new RolloutError('failed_precondition', `journal.dir: ${file} is damaged: reading it killed a check process with ${result.signal} (garbage in its pages: a disk fault, or an incomplete or corrupted copy); ${damagedAdvice(dir)}`, { field: 'journal.dir' });
  }
  if (result.status !== 0) {
    const cause = result.stderr.split('\n').find((l) => /^\w*Error: /.test(l)) ?? `exit ${result.status}`;
    // LMDB saw a page that is not what it should be: this process's own reads take other paths through the same
    // pages (ranges, cursors), where the same damage may be a wild pointer instead of an error.
    if (isDamaged(cause)) {
      throw new RolloutError('failed_precondition', `journal.dir: ${file} is damaged (LMDB: ${cause.replace(/^\w*Error: /, '')}); ${damagedAdvice(dir)}`, { field: 'journal.dir' });
    }
    log.warn({ file, reason: cause }, 'journal integrity check: an error reading the journal (the open reports it too, or quarantines what does not decode)');
    return;
  }
  log.debug({ file, records: Number(result.stdout), ms: Date.now() - started }, 'journal integrity check passed');
}
