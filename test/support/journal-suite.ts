import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { RootDatabase } from 'lmdb';
import { afterEach } from 'vitest';
import type { SessionOpened, Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { startServerHarness, type ServerHarness, type ServerHarnessOptions } from './server-harness.js';

/**
 * Resumes `sessionId` on `h` and takes everything it is owed (acking it as it comes, then closing): what its
 * `opened` said and the trajectories, in arrival order. How the journal suites check what a restart still owes.
 */
export async function owedOnResume(h: ServerHarness, sessionId: string): Promise<{ opened: SessionOpened; trajectories: Trajectory[] }> {
  const resumed = h.client.openSession({ sessionId, resume: true });
  const opened = await resumed.opened;
  resumed.close();
  const trajectories: Trajectory[] = [];
  for await (const t of resumed.trajectories()) trajectories.push(t);
  return { opened, trajectories };
}

/**
 * What the journal suites share: fresh journal directories and real servers on them (fake engine), every one
 * closed and removed after its test.
 */
export interface JournalSuite {
  /** A new empty directory under the temp dir (`prefix` names it), removed after the test. */
  dir(prefix: string): Promise<string>;
  /** A server whose journal is `dir` (`options.config` merged in), closed after the test. */
  server(dir: string, options?: ServerHarnessOptions): Promise<ServerHarness>;
  /** Closes `h` after the test (a harness started some other way); returns it. */
  track(h: ServerHarness): ServerHarness;
  /**
   * What a `kill -9` of `h` at this instant leaves of its journal, in a new directory (removed after the test): the
   * last committed transaction, as LMDB copies a live store (one consistent read). Writes issued and not committed yet
   * are not in it, as they would not survive the kill; nothing a graceful shutdown writes is in it. `h` goes on; a
   * server started on the copy recovers from the crash.
   */
  crashImage(h: ServerHarness): Promise<string>;
}

export function journalSuite(): JournalSuite {
  const dirs: string[] = [];
  const harnesses: ServerHarness[] = [];
  afterEach(async () => {
    await Promise.all(harnesses.splice(0).map((h) => h.close()));
    await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
  });
  const track = (h: ServerHarness): ServerHarness => {
    harnesses.push(h);
    return h;
  };
  const dir = async (prefix: string): Promise<string> => {
    const made = await mkdtemp(join(tmpdir(), prefix));
    dirs.push(made);
    return made;
  };
  return {
    dir,
    server: async (journalDir, options = {}) => track(await startServerHarness({ ...options, config: { ...options.config, journal: { ...options.config?.journal, dir: journalDir } } })),
    track,
    crashImage: async (h) => {
      const image = await dir('journal-crash-image-');
      const db = (h.server.journal as unknown as { db: RootDatabase } | undefined)?.db;
      if (!db) throw new Error('crashImage: the server has no journal');
      await db.backup(image, false);
      return image;
    },
  };
}
