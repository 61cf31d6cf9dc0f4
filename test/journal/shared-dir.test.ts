import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

const dirs: string[] = [];
const harnesses: ServerHarness[] = [];
afterEach(async () => {
  await Promise.all(harnesses.splice(0).map((h) => h.close()));
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

describe('one journal directory, two servers at once', () => {
  it('the second server refuses to start (failed_precondition naming journal.dir) instead of sharing the journal', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'journal-shared-'));
    dirs.push(dir);
    const a = await startServerHarness({ config: { journal: { dir } } });
    harnesses.push(a);
    let second: ServerHarness | undefined;
    const outcome = await startServerHarness({ config: { journal: { dir } } }).then(
      (h) => {
        second = h;
        harnesses.push(h);
        return 'started';
      },
      (err: unknown) => err,
    );
    // Both would recover (and re-run) the same unfinished samples, and each one's compaction deletes records of tasks
    // the other accepted after it opened (its in-memory index never saw them, its session set neither).
    expect(second?.server.address, 'a second server started on a journal directory already in use').toBeUndefined();
    expect(outcome).toMatchObject({ code: 'failed_precondition' });
  }, 60_000);
});
