import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../../src/errors.js';
import { bytesSource, locateSystemPartition, readSifFile, SIF_HEADER_SIZE } from '../../../src/sandboxes/images/sif.js';
import { makeSif, makeSquashfs, makeTinyRootfs, makeTinySif, siftoolObjectStart } from './tiny-image.js';

let dir: string;
let tiny: string;
let tinyBytes: Buffer;
let squashfs: string;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'sif-test-'));
  tiny = makeTinySif(dir);
  tinyBytes = readFileSync(tiny);
  squashfs = `${tiny}.squashfs`;
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

async function failure(promise: Promise<unknown>): Promise<RolloutError> {
  const err: unknown = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(RolloutError);
  return err as RolloutError;
}

describe('SIF reading', () => {
  it('finds the squashfs system partition where siftool says it is', async () => {
    const partition = await readSifFile(tiny);
    expect(partition.offset).toBe(siftoolObjectStart(tiny, 1));
    expect(partition.arch).toBe(process.arch);
    expect(tinyBytes.subarray(partition.offset, partition.offset + 4).toString('latin1')).toBe('hsqs');
    expect(tinyBytes.subarray(partition.offset, partition.offset + partition.size).equals(readFileSync(squashfs).subarray(0, partition.size))).toBe(true);
  });

  it('finds the primary partition behind a definition file and a data partition', async () => {
    const deffile = join(dir, 'recipe.def');
    writeFileSync(deffile, 'bootstrap: debootstrap\n');
    const data = join(dir, 'data.squashfs');
    const dataRoot = join(dir, 'data-root');
    makeTinyRootfs(dataRoot);
    makeSquashfs(dataRoot, data);
    const sif = join(dir, 'layered.sif');
    makeSif(sif, [{ file: data, parttype: 3 }, { file: squashfs }], deffile);
    const partition = await readSifFile(sif);
    expect(partition.id).toBe(3);
    expect(partition.offset).toBe(siftoolObjectStart(sif, 3));
  });

  it('refuses a SIF without a primary system partition', async () => {
    const sif = join(dir, 'data-only.sif');
    makeSif(sif, [{ file: squashfs, parttype: 3 }]);
    const err = await failure(readSifFile(sif));
    expect(err.code).toBe('sandbox_error');
    expect(err.message).toContain(sif);
    expect(err.message).toContain('no primary system partition');
  });

  it('refuses a system partition that is not squashfs', async () => {
    const raw = join(dir, 'raw.img');
    writeFileSync(raw, Buffer.alloc(8192, 7));
    const sif = join(dir, 'ext3.sif');
    makeSif(sif, [{ file: raw, partfs: 2 }]);
    expect((await failure(readSifFile(sif))).message).toContain('is not squashfs');
  });

  it('refuses a file that is not a SIF, naming it', async () => {
    const err = await failure(readSifFile(squashfs));
    expect(err.message).toBe(`${squashfs} is not a usable SIF image: no SIF_MAGIC at byte 32 (not a SIF file)`);
  });

  it('refuses a missing file with sandbox_error', async () => {
    const err = await failure(readSifFile(join(dir, 'missing.sif')));
    expect(err.code).toBe('sandbox_error');
    expect(err.message).toContain('missing.sif');
  });

  it('refuses a SIF truncated inside its partition', async () => {
    const cut = join(dir, 'cut.sif');
    writeFileSync(cut, tinyBytes.subarray(0, tinyBytes.length - 1));
    expect((await failure(readSifFile(cut))).message).toMatch(/truncated: the system partition \(object 1\) ends at byte \d+, past the file's \d+ bytes/);
  });

  it('gives a clear error or a consistent parse for any truncation or byte mutation (property)', async () => {
    const original = await locateSystemPartition(bytesSource(tinyBytes), 'tiny.sif');
    // Mutations land where the parser reads: the header, the first descriptors and the squashfs superblock.
    const hot = fc.oneof(fc.integer({ min: 0, max: SIF_HEADER_SIZE - 1 }), fc.integer({ min: 4096, max: 4096 + 2 * 585 }), fc.integer({ min: original.offset, max: original.offset + 95 }));
    const mutation = fc.record({
      writes: fc.array(fc.tuple(fc.oneof(hot, fc.nat({ max: tinyBytes.length - 1 })), fc.integer({ min: 0, max: 255 })), { maxLength: 6 }),
      length: fc.oneof(fc.constant(tinyBytes.length), fc.nat({ max: tinyBytes.length })),
    });
    await fc.assert(
      fc.asyncProperty(mutation, async ({ writes, length }) => {
        const bytes = Buffer.from(tinyBytes.subarray(0, length));
        for (const [at, value] of writes) if (at < bytes.length) bytes[at] = value;
        let result;
        try {
          result = await locateSystemPartition(bytesSource(bytes), 'mutant.sif');
        } catch (err) {
          expect(err).toBeInstanceOf(RolloutError);
          expect((err as RolloutError).code).toBe('sandbox_error');
          expect((err as RolloutError).message).toMatch(/^mutant\.sif is not a usable SIF image: \S/);
          return;
        }
        expect(result.offset + result.size).toBeLessThanOrEqual(bytes.length);
        expect(bytes.subarray(result.offset, result.offset + 4).toString('latin1')).toBe('hsqs');
        if (writes.length === 0 && length === tinyBytes.length) expect(result).toEqual(original);
      }),
      { numRuns: 500 },
    );
  });
});
