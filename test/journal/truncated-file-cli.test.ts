import { spawn } from 'node:child_process';
import { mkdtemp, rm, stat, truncate } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { open } from 'lmdb';
import { afterEach, describe, expect, it } from 'vitest';
import { NODE_FLAGS } from '../../src/cli/node-flags.js';
import { Journal } from '../../src/journal/journal.js';
import { silentLogger } from '../../src/observability/logger.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const dirs: string[] = [];
afterEach(async () => {
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

/** `rollout serve --fake-engine --journal-dir dir`, run until it exits (or is killed after `ms`). */
function serve(dir: string, ms = 40_000): Promise<{ code: number | null; signal: NodeJS.Signals | null; out: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [...NODE_FLAGS, 'bin/rollout.js', 'serve', '--port', '0', '--fake-engine', '--journal-dir', dir], {
      cwd: root,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    const take = (d: Buffer): void => {
      out += d.toString();
      if (/rollout server listening on/.test(out)) child.kill('SIGKILL');
    };
    child.stdout.on('data', take);
    child.stderr.on('data', take);
    const timer = setTimeout(() => child.kill('SIGKILL'), ms);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, out });
    });
  });
}

describe('rollout serve on a damaged journal', () => {
  it('a truncated data.mdb (an interrupted copy/rsync of the journal dir) is refused with one line, not a SIGBUS', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'journal-trunc-'));
    dirs.push(dir);
    const { journal } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    for (let i = 0; i < 300; i++) {
      await journal.accepted(`t${i}`, new Uint8Array(300), 1, '');
      await journal.finished(`t${i}`, 0, new Uint8Array(9000).fill(7));
    }
    await journal.close();
    const file = join(dir, 'data.mdb');
    await truncate(file, Math.floor((await stat(file)).size / 2));
    const run = await serve(dir);
    // Was: killed by SIGBUS while reading the map past the end of the file, no message at all. Now failed_precondition,
    // which the CLI exits with 2 (a configuration the operator must fix, as for every failed_precondition).
    expect({ signal: run.signal, code: run.code }).toEqual({ signal: null, code: 2 });
    expect(run.out).toMatch(/journal\.dir: .*data\.mdb is truncated/);
    expect(run.out).not.toMatch(/\n\s+at /);
  }, 60_000);

  it('a record that does not decode is reported in one line (exit 1), not a stack trace', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'journal-badrec-'));
    dirs.push(dir);
    const db = open({ path: dir, compression: false });
    await db.put(['t', 'hand-edited'], { spec: new Uint8Array([0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]), numSamples: 1, session: '', acceptedAt: 1 });
    await db.close();
    const run = await serve(dir);
    expect(run.out).not.toMatch(/\n\s+at /); // README: "A stack trace means a bug."
    expect(run.out).toMatch(/journal/i);
  }, 60_000);
});
