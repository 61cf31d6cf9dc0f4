import { constants } from 'node:fs';
import { access } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

/**
 * Where scripts/setup.sh builds the sandboxes' PID 1 (sandbox-init.c, static): `<project>/.cache/bin`. The
 * environment variable ROLLOUT_SANDBOX_INIT names another build (a packaged install, a read-only checkout).
 */
export const DEFAULT_SANDBOX_INIT = fileURLToPath(new URL('../../../.cache/bin/rollout-sandbox-init', import.meta.url));

/** Where the init is bound inside every sandbox (read-only, on bwrap's own root, never an image's path). */
export const SANDBOX_INIT_PATH = '/.sandbox-init';

/**
 * The init binary to use: the option's path, else ROLLOUT_SANDBOX_INIT, else the project's build; undefined when it
 * is not an executable file (the caller falls back to bwrap's init and a holder shell, and says what that costs).
 * `false` asks for the fallback.
 */
export async function resolveSandboxInit(option: string | false | undefined): Promise<{ path: string | undefined; tried: string }> {
  if (option === false) return { path: undefined, tried: 'disabled' };
  const tried = option ?? (process.env.ROLLOUT_SANDBOX_INIT || DEFAULT_SANDBOX_INIT);
  const ok = await access(tried, constants.X_OK).then(() => true, () => false);
  return { path: ok ? tried : undefined, tried };
}
