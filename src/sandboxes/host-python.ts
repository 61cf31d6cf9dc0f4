import { execFile } from 'node:child_process';
import { realpath } from 'node:fs/promises';
import { dirname } from 'node:path';

/** Where the host's Python lives, so the sandbox can bind exactly that installation read-only. */
export interface HostPython {
  /** sys.executable as the host sees it (may be a venv or pyenv path, not a shim). */
  executable: string;
  /** Directory to put first on the sandbox's PATH, so `python3` inside is this interpreter. */
  binDir: string;
  /**
   * Installation roots to bind read-only (prefix and base_prefix): `source` is the host's real path, `dest` the
   * path Python reports, so interpreter paths and any RPATH baked at build time keep working inside.
   */
  roots: Array<{ source: string; dest: string }>;
}

const PROBE = 'import json, sys; print(json.dumps([sys.executable, sys.prefix, sys.base_prefix]))';

/**
 * Resolves the real interpreter behind `command` by asking it (`sys.executable`, `sys.prefix`,
 * `sys.base_prefix`). Why ask rather than follow the PATH: pyenv/asdf shims are shell scripts that need the
 * host's whole home directory; inside the sandbox only the resolved installation is bound. Returns undefined
 * when there is no usable Python (the sandbox still works, without it).
 */
export async function resolveHostPython(command = 'python3'): Promise<HostPython | undefined> {
  const out = await new Promise<string | undefined>((resolve) => {
    execFile(command, ['-c', PROBE], { timeout: 15_000, encoding: 'utf8' }, (err, stdout) => resolve(err ? undefined : stdout));
  });
  if (out === undefined) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(out);
  } catch {
    return undefined;
  }
  if (!Array.isArray(parsed) || parsed.length !== 3 || !parsed.every((p) => typeof p === 'string' && p.startsWith('/'))) return undefined;
  const [executable, prefix, basePrefix] = parsed as [string, string, string];
  const roots: HostPython['roots'] = [];
  for (const root of [prefix, basePrefix]) {
    const real = await realpath(root).catch(() => undefined);
    if (real === undefined) continue;
    for (const dest of new Set([root, real])) {
      if (!roots.some((r) => r.dest === dest)) roots.push({ source: real, dest });
    }
  }
  return { executable, binDir: dirname(executable), roots };
}
