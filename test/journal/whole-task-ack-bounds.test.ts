import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { MAX_ACK_ENTRIES } from '../../src/contract/session.js';
import { Journal } from '../../src/journal/journal.js';
import { silentLogger } from '../../src/observability/logger.js';

// A whole-task ack stands for every finished sample of the task. An ack within its entry bound naming one task again
// and again (65536 times a 256-sample task) used to be expanded once per mention: 16 million refs built and checked on
// the event loop. Each task is expanded once.

const dirs: string[] = [];
afterEach(async () => {
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

describe('the journal recording an ack that names one task many times', () => {
  it('expands the task once: every sample acked, in milliseconds', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollout-journal-ack-'));
    dirs.push(dir);
    const { journal } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    try {
      const n = 256;
      await journal.accepted('wide', new Uint8Array(8), n, 'trainer');
      await Promise.all(Array.from({ length: n }, (_, i) => journal.finished('wide', i, new Uint8Array(4))));
      const started = performance.now();
      journal.ack({ taskIds: Array.from({ length: MAX_ACK_ENTRIES }, () => 'wide'), trajectories: [] }, 'trainer');
      const ms = performance.now() - started;
      // Before the fix: seconds (16.7M refs); now one pass over 256 samples.
      expect(ms).toBeLessThan(1_000);
      // Every sample acked by the task's session: nothing owed, so compaction drops it.
      expect(await journal.compact()).toBe(1);
    } finally {
      await journal.close();
    }
  });
});
