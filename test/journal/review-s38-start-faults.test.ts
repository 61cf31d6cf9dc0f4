import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { Journal } from '../../src/journal/journal.js';
import { silentLogger } from '../../src/observability/logger.js';

// Mounting a small tmpfs needs root (CI runs as root; so does this VM).
describe.skipIf(process.getuid?.() !== 0)('opening a journal whose file system is full (no byte left)', () => {
  let mount: string;
  beforeAll(() => {
    mount = mkdtempSync(join(tmpdir(), 'rollout-s38-startfull-'));
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', mount]);
  });
  afterAll(() => {
    execFileSync('umount', [mount]);
    rmSync(mount, { recursive: true, force: true });
  });

  it('refuses with FAILED_PRECONDITION naming journal.dir, the full file system and what to do, and keeps what the journal holds', async () => {
    const dir = join(mount, 'journal');
    const first = Journal.open({ dir, maxBytes: 16 << 20, logger: silentLogger() }).journal;
    await first.accepted('kept', new Uint8Array(64).fill(7), 1, '');
    await first.close();
    // Whatever room is left goes to another file: the disk is full when the server restarts.
    try {
      writeFileSync(join(mount, 'filler'), Buffer.alloc(2 << 20));
    } catch {
      // ENOSPC once the disk is full: what this wanted
    }
    let refused: unknown;
    try {
      Journal.open({ dir, maxBytes: 16 << 20, logger: silentLogger() });
    } catch (err) {
      refused = err;
    }
    // Before the fix: Node's bare "ENOSPC: no space left on device, write" from the lock file.
    expect(refused).toBeInstanceOf(RolloutError);
    expect(refused).toMatchObject({ code: 'failed_precondition', field: 'journal.dir' });
    expect((refused as Error).message).toMatch(new RegExp(`^journal\\.dir: the file system of ${dir} is full \\(ENOSPC .*\\): .*free space on it and start again \\(what the journal holds is kept\\)$`));
    rmSync(join(mount, 'filler'));
    const { journal, contents } = Journal.open({ dir, maxBytes: 16 << 20, logger: silentLogger() });
    expect(contents.tasks.map((t) => t.taskId)).toEqual(['kept']);
    await journal.close();
  });
});
