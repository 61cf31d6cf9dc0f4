import { chmodSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

/** The shell script that stands in for `apptainer` (a TEST DOUBLE: see its header). */
export const APPTAINER_DOUBLE = resolve(import.meta.dirname, '../fixtures/apptainer-test-double.sh');

export interface ApptainerDouble {
  /** An `apptainer` launcher for the driver's `binary` option, bound to this double's own state dir. */
  binary: string;
  state: string;
  /** A per-double temp root for the driver's host dirs. */
  tmpRoot: string;
  /** Every recorded invocation's argv, oldest first. */
  calls(): Promise<string[][]>;
  cleanup(): Promise<void>;
}

/**
 * A fresh double (created synchronously, so suites can build drivers in describe bodies) with its own state, so parallel test files never see each other's instances. The driver runs
 * its binary with a minimal environment, so the state dir is baked into a small launcher script.
 */
export function makeApptainerDouble(options: { refuseCgroups?: boolean; refuseOverlay?: 'create' | 'start' } = {}): ApptainerDouble {
  const root = mkdtempSync(join(tmpdir(), 'apptainer-double-'));
  const state = join(root, 'state');
  const tmpRoot = join(root, 'tmp');
  mkdirSync(state);
  mkdirSync(tmpRoot);
  const binary = join(root, 'apptainer');
  const env = `FAKE_APPTAINER_STATE='${state}'${options.refuseCgroups ? ' FAKE_APPTAINER_REFUSE_CGROUPS=1' : ''}${options.refuseOverlay ? ` FAKE_APPTAINER_REFUSE_OVERLAY=${options.refuseOverlay}` : ''}`;
  writeFileSync(binary, `#!/bin/sh\n${env} exec '${APPTAINER_DOUBLE}' "$@"\n`);
  chmodSync(binary, 0o755);
  return {
    binary,
    state,
    tmpRoot,
    calls: async () => {
      const dir = join(state, 'calls');
      const files = (await readdir(dir).catch(() => [])).sort((a, b) => (BigInt(a.split('-')[0] ?? 0) < BigInt(b.split('-')[0] ?? 0) ? -1 : 1));
      return Promise.all(files.map(async (f) => (await readFile(join(dir, f), 'utf8')).split('\0').slice(0, -1)));
    },
    cleanup: async () => {
      // Stop whatever the double still runs (its instances are detached `sleep`s), then remove its files.
      for (const name of await readdir(join(state, 'instances')).catch(() => [])) {
        const pid = Number(await readFile(join(state, 'instances', name, 'pid'), 'utf8').catch(() => 'NaN'));
        if (Number.isInteger(pid)) {
          try {
            process.kill(pid, 'SIGKILL');
          } catch {
            // already gone
          }
        }
      }
      await rm(root, { recursive: true, force: true });
    },
  };
}
