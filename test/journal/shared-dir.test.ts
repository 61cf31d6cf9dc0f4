import { describe, expect, it } from 'vitest';
import { journalSuite } from '../support/journal-suite.js';
import type { ServerHarness } from '../support/server-harness.js';

const suite = journalSuite();

describe('one journal directory, two servers at once', () => {
  it('the second server refuses to start (failed_precondition naming journal.dir) instead of sharing the journal', async () => {
    const dir = await suite.dir('journal-shared-');
    await suite.server(dir);
    let second: ServerHarness | undefined;
    const outcome = await suite.server(dir).then(
      (h) => {
        second = h;
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
