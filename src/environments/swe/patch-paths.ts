import { parsePatch } from 'diff';

/**
 * Which files a unified diff (`git diff`, `diff -u`) touches, read with jsdiff's `parsePatch` (git's dialect
 * included: `diff --git` headers, new, deleted, renamed and binary files, C-quoted names). Applying patches is left
 * to `git apply` / `patch` inside the sandbox; this never applies anything, so a patch misread here can only reset
 * the wrong test files before the test patch, never change how the agent's code is evaluated.
 */

/** A file name as a patch writes it, without git's `a/` / `b/` prefix; undefined for none or /dev/null. */
export function patchFileName(name: string | undefined, prefix: 'a/' | 'b/'): string | undefined {
  if (name === undefined || name === '/dev/null') return undefined;
  return name.startsWith(prefix) ? name.slice(prefix.length) : name;
}

/**
 * Every path a patch reads or writes (old and new names, /dev/null left out), in order, once each. Throws jsdiff's
 * Error, naming the line, on a malformed patch (a hunk whose line counts do not match its header, a stray line).
 */
export function touchedPaths(patch: string): string[] {
  const paths = parsePatch(patch).flatMap((file) => [patchFileName(file.oldFileName, 'a/'), patchFileName(file.newFileName, 'b/')]);
  return [...new Set(paths.filter((p): p is string => p !== undefined))];
}
