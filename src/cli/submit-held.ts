import { closeSync, mkdirSync, openSync, readSync, rmSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { Trajectory, type TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';

/** What `rollout submit` needs of a held sample to decide on its group without reading it back. */
export interface HeldSample {
  status: TrajectoryStatus;
  error: string;
  finishReason: string;
  /** Where its bytes are in its group's file. */
  offset: number;
  length: number;
}

/**
 * The samples of groups that are not whole yet, for `rollout submit`: a group is written (or retried) only once whole
 * (submit-attempts.ts), and until then its samples wait in a file of their own in `<journal>.held/`, encoded as
 * protobuf, not in memory. Held as objects, 64 rows in flight of 1,024 long-context samples each were tens of GB of
 * heap (each token id, mask bit and logprob a JS number); on disk a group costs its bytes once, and the file goes when
 * the group is settled. Only the statuses and causes stay in memory. The directory belongs to the output's lock holder:
 * what a killed run left there is removed at open (those samples were acked as they arrived: the re-run submits the
 * task id again and gets them back while the server holds the task, or, once it forgot it, a new run of it, written
 * whole in place of any part of the group the killed run had written; see submit.ts `settle`).
 */
export class HeldGroups {
  private readonly groups = new Map<string, { file: string; fd: number; end: number; samples: Map<number, HeldSample> }>();
  private files = 0;

  constructor(private readonly dir: string) {
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { recursive: true });
  }

  /** Holds a sample; false when its group holds that sample index already (a sample delivered twice is held once). */
  hold(t: Trajectory): boolean {
    let group = this.groups.get(t.taskId);
    if (group === undefined) {
      const file = join(this.dir, `${this.files++}.bin`);
      group = { file, fd: openSync(file, 'w+'), end: 0, samples: new Map() };
      this.groups.set(t.taskId, group);
    }
    if (group.samples.has(t.sampleIndex)) return false;
    const bytes = Trajectory.encode(t).finish();
    try {
      for (let done = 0; done < bytes.length; ) done += writeSync(group.fd, bytes, done, bytes.length - done, group.end + done);
    } catch (err) {
      throw new Error(`cannot write ${group.file}: ${(err as Error).message}`, { cause: err }); // a full disk: the run stops
    }
    group.samples.set(t.sampleIndex, { status: t.status, error: t.error, finishReason: t.finishReason, offset: group.end, length: bytes.length });
    group.end += bytes.length;
    return true;
  }

  /** The samples held for a task, by sample index. */
  samples(taskId: string): ReadonlyMap<number, HeldSample> {
    return this.groups.get(taskId)?.samples ?? new Map();
  }

  /** The held samples of a task in sample-index order, read back one at a time. */
  *read(taskId: string): Generator<Trajectory> {
    const group = this.groups.get(taskId);
    if (group === undefined) return;
    for (const [, held] of [...group.samples].sort(([a], [b]) => a - b)) {
      const bytes = Buffer.alloc(held.length);
      for (let done = 0; done < held.length; ) done += readSync(group.fd, bytes, done, held.length - done, held.offset + done);
      yield Trajectory.decode(bytes);
    }
  }

  /** Forgets a task's held samples (its group was settled, or its submit refused). */
  release(taskId: string): void {
    const group = this.groups.get(taskId);
    if (group === undefined) return;
    this.groups.delete(taskId);
    closeSync(group.fd);
    rmSync(group.file, { force: true });
  }

  /** Drops every held sample and the directory (an interrupted run's are fetched again by the next). */
  close(): void {
    for (const taskId of [...this.groups.keys()]) this.release(taskId);
    rmSync(this.dir, { recursive: true, force: true });
  }
}
