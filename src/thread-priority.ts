import { readdirSync, readFileSync } from 'node:fs';
import { constants, setPriority } from 'node:os';
import { isMainThread } from 'node:worker_threads';

/**
 * The priority of the server's threads beside its event loop. On a busy machine (two cores shared with engines,
 * sandboxes or a trainer) the one thread that serves gRPC and the engines should get a core first; the others
 * serve it and can wait a little:
 * - token threads (src/tokens/token-worker.ts) lower their own priority when they start;
 * - the process's helper threads — V8's platform workers (the parallel and concurrent parts of every isolate's
 *   garbage collections, the token threads' included, and the optimizing compiler), libuv's pool and node's signal
 *   thread — are lowered by {@link lowerHelperThreads} when the server starts (config `lowerHelperThreads`, default
 *   on). A starved helper costs throughput, not correctness: V8's main thread joins or takes over whatever
 *   collection work the helpers have not picked up. libuv's pool also runs the journal's LMDB commits and native
 *   addons' work — the embedded llama.cpp engine's evaluation and the threads it starts — so on a machine whose
 *   cores are all taken by normal-priority work (sandboxes, a trainer) those wait longer too; nothing can tell the
 *   pool's threads from V8's on Node 20 (all are named "node"), and where nothing else wants the cores the
 *   priority changes nothing. Turn the option off when an embedded engine should compete as an equal.
 *
 * Linux only: there the nice value is per thread (setpriority on a thread id), so this lowers exactly the threads
 * named and never the event loop. Elsewhere it would lower the whole process, so nothing is done. Lowering never
 * needs privileges; a thread already below normal is left as it is (never raised).
 *
 * Measured (bench/README.md, orchestration round 16): with the helpers at normal priority the event loop waited for
 * a core while they ran (up to 32 ms at a time) at 64K-token contexts.
 */
export const BELOW_NORMAL = constants.priority.PRIORITY_BELOW_NORMAL;

/** Lowers the calling thread to {@link BELOW_NORMAL} (Linux); false when not done (another OS, or not allowed). */
export function lowerThisThread(): boolean {
  if (process.platform !== 'linux') return false;
  try {
    setPriority(BELOW_NORMAL);
    return true;
  } catch {
    return false; // not allowed (some containers): the thread runs at the normal priority
  }
}

/**
 * Lowers every thread of this process but the main one (the event loop) to {@link BELOW_NORMAL}, unless it already
 * is at least that low; returns the ids of the threads it lowered (none elsewhere than Linux). Threads created
 * later (a libuv pool thread started by a later first use) keep the priority of the thread that made them. Called
 * from a worker thread it does nothing: that thread's event loop would be one of the threads lowered, and so would
 * the embedding application's other threads.
 */
export function lowerHelperThreads(): number[] {
  if (process.platform !== 'linux' || !isMainThread) return [];
  let tids: string[];
  try {
    tids = readdirSync('/proc/self/task');
  } catch {
    return [];
  }
  const lowered: number[] = [];
  for (const name of tids) {
    const tid = Number(name);
    if (tid === process.pid) continue;
    const nice = niceOfThread(tid);
    if (nice === undefined || nice >= BELOW_NORMAL) continue;
    try {
      setPriority(tid, BELOW_NORMAL);
      lowered.push(tid);
    } catch {
      // the thread ended meanwhile, or lowering is not allowed: leave it
    }
  }
  return lowered;
}

/** A thread's nice value from /proc (proc(5) stat field 19), or undefined when it cannot be read (it ended). */
export function niceOfThread(tid: number): number | undefined {
  const nice = Number(threadStat(tid)?.[16]);
  return Number.isInteger(nice) ? nice : undefined;
}

/**
 * A thread of this process's /proc stat fields after its parenthesised name (which may hold spaces): proc(5) field 3
 * (state) is index 0, utime (14) is 11, stime (15) is 12, nice (19) is 16. Undefined when it cannot be read (it ended).
 */
export function threadStat(tid: number | string): string[] | undefined {
  try {
    const stat = readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  } catch {
    return undefined;
  }
}
