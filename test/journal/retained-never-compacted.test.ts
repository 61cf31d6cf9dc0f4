import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ServiceError } from '@grpc/grpc-js';
import { afterEach, describe, expect, it } from 'vitest';
import { mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

const dirs: string[] = [];
const harnesses: ServerHarness[] = [];
afterEach(async () => {
  await Promise.all(harnesses.splice(0).map((h) => h.close()));
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

const bulky = (id: string, i: number) => mathTask(id, 1, 500 + i, { metadata: { pad: 'x'.repeat(15_000) } });

describe('finished, unary-submitted tasks (nothing to ack) filling journal.maxBytes while the task store retains them', () => {
  it('admission is never refused for good: the journal bound wins over GetTrajectory retention (or recovers after compaction/restart)', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'journal-retained-'));
    dirs.push(dir);
    // journal.maxBytes lowered; retainFinishedTasks/Bytes left at their defaults (2000 tasks, 512 MiB).
    const config = { journal: { dir, maxBytes: 1 << 20 } };
    const a = await startServerHarness({ config });
    harnesses.push(a);
    let refused: ServiceError | undefined;
    let done = 0;
    for (let i = 0; i < 120 && !refused; i++) {
      try {
        await a.client.submit(bulky(`u-${i}`, i));
        await a.client.getTrajectory(`u-${i}`, { wait: true, deadlineMs: 60_000 });
        done++;
      } catch (err) {
        refused = err as ServiceError;
      }
    }
    if (refused) {
      // Every task is finished and was submitted by unary Submit: nothing waits for an ack. The background compaction
      // runs (what its timer calls) — and frees nothing, since the task store still retains every task; and the store
      // evicts only when a new task finishes, which admission no longer lets happen.
      await a.server.journal!.compact();
      const retry = await a.client.submit(bulky('after-compaction', 999)).then(
        () => 'accepted',
        (err: ServiceError) => `${err.code}: ${err.details}`,
      );
      await a.close();
      const b = await startServerHarness({ config });
      harnesses.push(b);
      const afterRestart = await b.client.submit(bulky('after-restart', 998)).then(
        () => 'accepted',
        (err: ServiceError) => `${err.code}: ${err.details}`,
      );
      expect({ done, firstRefusal: refused.details, retry, afterRestart }).toEqual({ done, firstRefusal: refused.details, retry: 'accepted', afterRestart: 'accepted' });
    }
  }, 300_000);
});
