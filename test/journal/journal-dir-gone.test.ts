import { existsSync, readFileSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { Journal } from '../../src/journal/journal.js';
import { silentLogger } from '../../src/observability/logger.js';

// What a server does when its journal directory changes under it while it runs. Whatever happens to the directory, a
// task is answered `accepted` only if a restart on that directory would find it: otherwise it is refused, and
// admission says why (the server keeps serving what it accepted before).

const dirs: string[] = [];
async function freshDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'rollout-journal-gone-'));
  dirs.push(dir);
  return dir;
}
afterEach(async () => {
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

const spec = new Uint8Array(16).fill(1);
const open = (dir: string): Journal => Journal.open({ dir, maxBytes: 16 << 20, logger: silentLogger() }).journal;

describe('a journal whose directory is removed or taken while the server runs', () => {
  it('refuses the next task (UNAVAILABLE naming journal.dir) once its files were removed, instead of accepting it into a deleted file', async () => {
    const dir = await freshDir();
    const journal = open(dir);
    let told: string | undefined;
    journal.onFullChange = (reason) => (told = reason);
    await journal.accepted('before', spec, 1, '');
    rmSync(dir, { recursive: true, force: true }); // an operator's clean-up, a tmp reaper
    // Before the fix: accepted (written to an unlinked file: gone at the next start).
    await expect(journal.accepted('after', spec, 1, '')).rejects.toMatchObject({ code: 'unavailable', message: expect.stringMatching(/journal\.dir: .*data\.mdb was removed or replaced while this server ran/) });
    expect(journal.fullReason).toMatch(/removed or replaced/);
    expect(told).toMatch(/removed or replaced/);
    await journal.close();
  });

  it('takes its lock file again when it was removed by hand, and refuses tasks once another server holds it', async () => {
    const dir = await freshDir();
    const journal = open(dir);
    const lock = join(dir, 'server.lock');
    unlinkSync(lock);
    // Nobody else holds it: taken again, so a second server is still refused.
    await journal.accepted('a', spec, 1, '');
    expect(existsSync(lock)).toBe(true);
    expect(JSON.parse(readFileSync(lock, 'utf8'))).toMatchObject({ pid: process.pid });
    // Removed again and taken by another server (pid 1 runs on this host): two servers on one journal would re-run
    // each other's samples and compact away each other's tasks. Before the fix: accepted.
    unlinkSync(lock);
    writeFileSync(lock, JSON.stringify({ pid: 1, host: hostname(), startedAt: 'now' }));
    await expect(journal.accepted('b', spec, 1, '')).rejects.toMatchObject({ code: 'unavailable', message: expect.stringMatching(/journal\.dir: .* is in use by another server \(pid 1/) });
    await journal.close();
    // Its lock is the other server's: closing does not remove it.
    expect(JSON.parse(readFileSync(lock, 'utf8'))).toMatchObject({ pid: 1 });
  });
});
