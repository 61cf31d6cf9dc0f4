import { closeSync, mkdtempSync, openSync, rmSync, statSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Journal } from '../../src/journal/journal.js';
import { silentLogger } from '../../src/observability/logger.js';
import { spawnServe, type ServeProcess } from '../support/rollout-process.js';
import { eventually } from '../support/wait.js';

const PAGE = 4096;

/** A journal holding `tasks` accepted tasks, closed (as a server leaves it). */
async function journalWith(dir: string, tasks: number): Promise<void> {
  const { journal } = Journal.open({ dir, maxBytes: 64 << 20, logger: silentLogger() });
  for (let i = 0; i < tasks; i++) await journal.accepted(`task-${i}`, new Uint8Array(200).fill(i % 251), 1, '');
  await journal.close();
}

/**
 * Overwrites every data page (not the two meta pages, so LMDB opens it and trusts what they point to) with
 * deterministic garbage (xorshift32 from `seed`), every other page: a disk that returned junk for some of its blocks.
 */
function garble(file: string, seed: number): void {
  const pages = Math.floor(statSync(file).size / PAGE);
  const fd = openSync(file, 'r+');
  let x = seed >>> 0;
  const next = (): number => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>>= 0);
  };
  try {
    for (let page = 2; page < pages; page++) {
      if (page % 2 === 1) continue;
      const junk = Buffer.alloc(PAGE);
      for (let i = 0; i < PAGE; i += 4) junk.writeUInt32LE(next(), i);
      writeSync(fd, junk, 0, PAGE, page * PAGE);
    }
  } finally {
    closeSync(fd);
  }
}

describe('a journal whose data.mdb has garbage in its pages', () => {
  const base = mkdtempSync(join(tmpdir(), 'rollout-s38-damaged-'));
  const servers: ServeProcess[] = [];
  afterAll(async () => {
    for (const s of servers) s.kill();
    await Promise.all(servers.map((s) => s.exited));
    rmSync(base, { recursive: true, force: true });
  });

  it.each([1, 2, 3, 4])('refuses to start naming the file and what to do (seed %i), never dies of a signal with no word', async (seed) => {
    const dir = join(base, `journal-${seed}`);
    await journalWith(dir, 300);
    garble(join(dir, 'data.mdb'), seed);
    let server: ServeProcess | undefined;
    let failure: unknown;
    try {
      server = await spawnServe(['--fake-engine', '--journal-dir', dir]);
      servers.push(server);
    } catch (err) {
      failure = err;
    }
    // It may not notice at all (garbage that happens to read as records is quarantined) — but it must not crash.
    if (server) {
      await eventually(() => server.logs('recovered from the journal').length > 0 || server.child.exitCode !== null || server.child.signalCode !== null, 'recovery or exit', 30_000);
      expect(server.child.signalCode, server.output()).toBeNull();
      return;
    }
    // Before the fix: "rollout serve exited before listening" with nothing about the journal (SIGSEGV / SIGABRT).
    const text = String(failure);
    expect(text).toContain(`journal.dir: ${join(dir, 'data.mdb')} is damaged`);
    expect(text).toContain(`mv ${dir} ${dir}.damaged`);
    expect(text).toMatch(/Lost with it: the tasks it had accepted/);
  }, 120_000);
});
