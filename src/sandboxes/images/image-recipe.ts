import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RolloutError } from '../../errors.js';

/**
 * What an image is built from, and the content hash that names the built file. Everything that changes the
 * result is in the recipe (suite, packages, architecture, variant, the builder's own version); the mirror is not,
 * since any mirror of a suite serves the same packages. A suite moves on (point releases), so a cached image is
 * pinned the day it was built: delete it, or bump BUILDER_VERSION, to rebuild.
 */
export interface ImageRecipe {
  /** Debian suite, e.g. "bookworm". */
  suite: string;
  /** Debian packages on top of debootstrap's minbase, sorted and unique. */
  packages: readonly string[];
  /** Debian architecture, e.g. "amd64". */
  arch: string;
  variant: 'minbase';
  /** Bumped whenever the build steps change what comes out (trimming, compression, SIF layout). */
  builder: number;
}

/** Version of the build steps in build-image.ts; part of every image's hash. */
export const BUILDER_VERSION = 1;
export const DEFAULT_SUITE = 'bookworm';
/** The project's default image: enough for the python and bash tools (coreutils and bash are in minbase anyway). */
export const DEFAULT_IMAGE_PACKAGES: readonly string[] = ['bash', 'coreutils', 'python3'];
/** `<project>/.cache/images`, where scripts/setup.sh builds the default image. */
export const DEFAULT_IMAGE_CACHE_DIR = fileURLToPath(new URL('../../../.cache/images', import.meta.url));

/** Debian package names (policy 5.6.1): lower case alphanumerics, + - . ; at least two characters. */
const PACKAGE_NAME = /^[a-z0-9][a-z0-9+.-]+$/;
const SUITE_NAME = /^[a-z][a-z0-9-]*$/;

/** Node's `process.arch` as Debian names it. */
export function debianArch(nodeArch: string = process.arch): string {
  const arches: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'armhf', ia32: 'i386', ppc64: 'ppc64el', s390x: 's390x', riscv64: 'riscv64' };
  const arch = arches[nodeArch];
  if (!arch) throw new RolloutError('failed_precondition', `no Debian architecture for ${nodeArch}`);
  return arch;
}

/**
 * The recipe for `packages` on `suite`, validated (names that could pass for options are refused) and normalized
 * (sorted, deduplicated), so the same set in any order has one hash.
 */
export function imageRecipe(packages: readonly string[], suite: string = DEFAULT_SUITE): ImageRecipe {
  if (!SUITE_NAME.test(suite)) throw RolloutError.invalid('suite', `not a Debian suite name: ${JSON.stringify(suite)}`);
  const normalized = [...new Set(packages.map((p) => p.trim()).filter(Boolean))].sort();
  if (normalized.length === 0) throw RolloutError.invalid('packages', 'at least one package is needed');
  for (const name of normalized) {
    if (!PACKAGE_NAME.test(name)) throw RolloutError.invalid('packages', `not a Debian package name: ${JSON.stringify(name)}`);
  }
  return { suite, packages: normalized, arch: debianArch(), variant: 'minbase', builder: BUILDER_VERSION };
}

/** Hex SHA-256 of the recipe's canonical JSON, first 16 digits: the image's identity in the cache. */
export function recipeHash(recipe: ImageRecipe): string {
  const canonical = JSON.stringify({ suite: recipe.suite, packages: recipe.packages, arch: recipe.arch, variant: recipe.variant, builder: recipe.builder });
  return createHash('sha256').update(canonical).digest('hex').slice(0, 16);
}

/** Where the image of `recipe` lives in `cacheDir`: `debian-<suite>-<arch>-<hash>.sif`. */
export function imagePath(recipe: ImageRecipe, cacheDir: string = DEFAULT_IMAGE_CACHE_DIR): string {
  return join(cacheDir, `debian-${recipe.suite}-${recipe.arch}-${recipeHash(recipe)}.sif`);
}

/**
 * The path of the project's default image (python3, bash, coreutils on bookworm) in `cacheDir`. The file exists
 * once scripts/setup.sh (or `rollout image build`) has built it; callers check before use.
 */
export function defaultImagePath(cacheDir: string = DEFAULT_IMAGE_CACHE_DIR): string {
  return imagePath(imageRecipe(DEFAULT_IMAGE_PACKAGES), cacheDir);
}
