import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { Journal } from '../../src/journal/journal.js';
import { silentLogger } from '../../src/observability/logger.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

async function openFailure(dir: string): Promise<unknown> {
  try {
    await Journal.open({ dir, maxBytes: 16 << 20, logger: silentLogger() }).journal.close();
  } catch (err) {
    return err;
  }
  return undefined;
}

describe('a journal.dir that is not a directory', () => {
  // Before the fix: Node's bare "EEXIST: file already exists, mkdir '<dir>'" (and ENOTDIR for a parent that is a file).
  it('a regular file: failed_precondition naming journal.dir, the path and that it is a file, not a directory', async () => {
    const base = mkdtempSync(join(tmpdir(), 'rollout-s39-dirfile-'));
    dirs.push(base);
    const file = join(base, 'journal');
    writeFileSync(file, 'x');
    const err = await openFailure(file);
    expect(err).toBeInstanceOf(RolloutError);
    expect(err).toMatchObject({ code: 'failed_precondition', field: 'journal.dir' });
    expect((err as Error).message).toBe(`journal.dir: ${file} is a file, not a directory: give journal.dir a directory (it is created if missing)`);
  });

  it('a path under a regular file: failed_precondition naming the file in the way', async () => {
    const base = mkdtempSync(join(tmpdir(), 'rollout-s39-dirfile-'));
    dirs.push(base);
    const file = join(base, 'plain');
    writeFileSync(file, 'x');
    const dir = join(file, 'sub', 'journal');
    const err = await openFailure(dir);
    expect(err).toBeInstanceOf(RolloutError);
    expect(err).toMatchObject({ code: 'failed_precondition', field: 'journal.dir' });
    expect((err as Error).message).toBe(`journal.dir: cannot create ${dir}: ${file} is a file, not a directory`);
  });
});
