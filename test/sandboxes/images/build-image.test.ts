import { execFile } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../../src/errors.js';
import { buildImage } from '../../../src/sandboxes/images/build-image.js';
import { DEFAULT_IMAGE_CACHE_DIR, defaultImagePath, imagePath, imageRecipe, recipeHash } from '../../../src/sandboxes/images/image-recipe.js';

const run = promisify(execFile);
const isRoot = process.getuid?.() === 0;
const cliPath = fileURLToPath(new URL('../../../bin/rollout.js', import.meta.url));

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'build-image-test-'));
  chmodSync(dir, 0o755);
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('image recipes', () => {
  it('hash the same package set the same in any order, with duplicates and blanks', () => {
    expect(recipeHash(imageRecipe(['python3', 'bash', 'python3', ' coreutils', '']))).toBe(recipeHash(imageRecipe(['coreutils', 'bash', 'python3'])));
  });

  it('hash another package set or suite differently', () => {
    const base = recipeHash(imageRecipe(['python3']));
    expect(recipeHash(imageRecipe(['python3', 'git']))).not.toBe(base);
    expect(recipeHash(imageRecipe(['python3'], 'trixie'))).not.toBe(base);
  });

  it('refuse names that are no Debian package or suite (no option injection)', () => {
    for (const bad of ['--foo', 'a', 'Python3', 'x;rm', 'a b']) {
      expect(() => imageRecipe([bad])).toThrow(RolloutError);
    }
    expect(() => imageRecipe(['python3'], '--keyring=/x')).toThrow(/suite/);
    expect(() => imageRecipe([])).toThrow(/at least one package/);
  });

  it('place the default image in .cache/images under its hash', () => {
    expect(defaultImagePath()).toBe(imagePath(imageRecipe(['bash', 'coreutils', 'python3']), DEFAULT_IMAGE_CACHE_DIR));
    expect(defaultImagePath()).toMatch(/\/\.cache\/images\/debian-bookworm-[a-z0-9]+-[0-9a-f]{16}\.sif$/);
  });
});

describe('buildImage', () => {
  it('returns a cached image without building it', async () => {
    const cacheDir = join(dir, 'cache');
    mkdirSync(cacheDir);
    const expected = imagePath(imageRecipe(['git', 'python3']), cacheDir);
    writeFileSync(expected, 'a built image');
    const progress: unknown[] = [];
    const image = await buildImage({ packages: ['python3', 'git'], cacheDir, onProgress: (p) => progress.push(p) });
    expect(image).toMatchObject({ path: expected, cached: true });
    expect(progress).toEqual([]);
  });

  it.runIf(isRoot)('refuses to build as non-root with a message that says why and what to run', async () => {
    const cacheDir = join(dir, 'nonroot-cache');
    const uid = String(0x60000000 + 99);
    const err = await run('setpriv', ['--reuid', uid, '--regid', uid, '--clear-groups', 'env', 'HOME=/tmp', process.execPath, cliPath, 'image', 'build', '--packages', 'git', '--cache-dir', cacheDir]).catch((e: unknown) => e);
    expect((err as { code: number }).code).toBe(2);
    expect((err as { stderr: string }).stderr).toContain('rollout: building images needs root');
  });

  it('stops before any work when the signal is already aborted', async () => {
    const controller = new AbortController();
    controller.abort();
    await expect(buildImage({ packages: ['python3', 'git'], cacheDir: join(dir, 'aborted'), signal: controller.signal })).rejects.toMatchObject({ code: 'cancelled' });
  });
});
