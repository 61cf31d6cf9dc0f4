import { chmod, readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';

/**
 * Removes a sandbox's work dir, whatever the sandboxed program did to it. Why not just `rm -rf`: the program
 * owns the files and may `chmod 000` a directory, which makes a non-root host user unable to list or delete its
 * contents; we restore owner permissions and retry. Never follows symlinks (rm does not, and chmod is only
 * applied to entries that are real directories).
 */
export async function removeTree(dir: string): Promise<void> {
  try {
    await rm(dir, { recursive: true, force: true, maxRetries: 2 });
    return;
  } catch {
    await makeWritable(dir);
  }
  await rm(dir, { recursive: true, force: true, maxRetries: 2 });
}

async function makeWritable(dir: string): Promise<void> {
  await chmod(dir, 0o700).catch(() => undefined);
  const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
  for (const entry of entries) {
    if (entry.isDirectory()) await makeWritable(join(dir, entry.name));
  }
}
