import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach } from 'vitest';
import { startServerHarness, type ServerHarness, type ServerHarnessOptions } from './server-harness.js';

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
  return {
    dir: async (prefix) => {
      const dir = await mkdtemp(join(tmpdir(), prefix));
      dirs.push(dir);
      return dir;
    },
    server: async (dir, options = {}) => track(await startServerHarness({ ...options, config: { ...options.config, journal: { ...options.config?.journal, dir } } })),
    track,
  };
}
