import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { Journal } from '../../src/journal/journal.js';
import { silentLogger } from '../../src/observability/logger.js';

// Mounting a small tmpfs needs root (CI runs as root; so does this VM).
describe.skipIf(process.getuid?.() !== 0)('a journal whose file system is full (a 2 MiB tmpfs, filled)', () => {
  let mount: string;
  beforeAll(() => {
    mount = mkdtempSync(join(tmpdir(), 'rollout-s39-diskfull-'));
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=2m', 'tmpfs', mount]);
  });
  afterAll(() => {
    execFileSync('umount', [mount]);
    rmSync(mount, { recursive: true, force: true });
  });

  it('stays full (admission off) through compaction while the disk is still full, and is cleared by the next commit that succeeds once there is room', async () => {
    const dir = join(mount, 'journal');
    // Far below its bound: only the disk is full, never the journal.
    const { journal } = Journal.open({ dir, maxBytes: 64 << 20, logger: silentLogger(), commitProbeMs: 3_600_000 });
    const reasons: (string | undefined)[] = [];
    journal.onFullChange = (reason) => reasons.push(reason);
    try {
      await journal.accepted('before', new Uint8Array(64).fill(1), 1, '');
      try {
        writeFileSync(join(mount, 'filler'), Buffer.alloc(4 << 20));
      } catch {
        // ENOSPC once the disk is full: what this wanted
      }
      let refused: unknown;
      for (let i = 0; i < 20 && !refused; i++) {
        await journal.accepted(`during-${i}`, new Uint8Array(64 << 10).fill(2), 1, '').catch((err: unknown) => (refused = err));
      }
      expect(refused).toBeInstanceOf(RolloutError);
      expect(refused).toMatchObject({ code: 'resource_exhausted' });
      expect(journal.fullReason).toMatch(/^the journal's disk is full/);

      // Compaction (in the background every minute, and on an accept past the bound) finds the journal under its
      // bound: the disk is as full as it was. Before the fix this said "accepts tasks again" (and rollout.admission
      // SERVING) until the next accept failed again: the state flapped with every compaction.
      await journal.compact();
      expect(journal.fullReason).toMatch(/^the journal's disk is full/);
      expect(reasons).toEqual([expect.stringMatching(/^the journal's disk is full/)]);

      // Room again: the next commit that succeeds clears it.
      rmSync(join(mount, 'filler'));
      await journal.accepted('after', new Uint8Array(64).fill(3), 1, '');
      expect(journal.fullReason).toBeUndefined();
      expect(reasons).toEqual([expect.stringMatching(/^the journal's disk is full/), undefined]);
    } finally {
      await journal.close();
    }
  });
});
