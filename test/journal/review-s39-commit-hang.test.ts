import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { status, type ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { Journal } from '../../src/journal/journal.js';
import { silentLogger } from '../../src/observability/logger.js';
import { mathTask } from '../support/harness.js';
import { healthStatuses } from '../support/health.js';
import { spawnServe, type ServeProcess } from '../support/rollout-process.js';
import { eventually, within } from '../support/wait.js';

/**
 * A fault-injecting DOUBLE of libc's fsync and fdatasync, loaded into the server with LD_PRELOAD (the seam of
 * review-s38-eio-health: LMDB's native commit syncs before it writes its meta page). While the file $S39_HANG_FILE
 * exists, a sync of a file under $S39_HANG_DIR does not return (a stuck disk, an NFS server gone): it waits until the
 * file is removed, then syncs for real. Every other call passes through.
 */
const FSYNC_HANG_DOUBLE = String.raw`
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static int watched(int fd) {
  const char *dir = getenv("S39_HANG_DIR");
  if (!dir) return 0;
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = 0;
  return strncmp(path, dir, strlen(dir)) == 0;
}
static void hang_while_flagged(int fd) {
  const char *flag = getenv("S39_HANG_FILE");
  if (!flag || !watched(fd)) return;
  while (access(flag, F_OK) == 0) usleep(20000);
}
#define DOUBLE(name) int name(int fd) { \
  static int (*real)(int); \
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, #name); \
  hang_while_flagged(fd); \
  return real(fd); \
}
DOUBLE(fsync)
DOUBLE(fdatasync)
`;

function hasCompiler(): boolean {
  try {
    execFileSync('gcc', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

const WATCHED = ['', 'rollout.v1.RolloutService', 'rollout.admission'];

async function refusal(p: Promise<unknown>): Promise<ServiceError | undefined> {
  return p.then(
    () => undefined,
    (err: unknown) => err as ServiceError,
  );
}

describe.skipIf(!hasCompiler())('a journal commit that does not complete (LD_PRELOAD double: fsync hangs)', () => {
  let base: string;
  let library: string;
  const servers: ServeProcess[] = [];
  beforeAll(() => {
    base = mkdtempSync(join(tmpdir(), 'rollout-s39-hang-'));
    writeFileSync(join(base, 'fsync-hang-double.c'), FSYNC_HANG_DOUBLE);
    library = join(base, 'fsync-hang-double.so');
    execFileSync('gcc', ['-shared', '-fPIC', '-O1', '-o', library, join(base, 'fsync-hang-double.c'), '-ldl']);
  });
  afterAll(async () => {
    rmSync(join(base, 'hang'), { force: true });
    for (const s of servers) s.kill();
    await Promise.all(servers.map((s) => s.exited));
    if (base) rmSync(base, { recursive: true, force: true });
  });

  it('refuses the accepts waiting on it UNAVAILABLE naming the wait and the file, says NOT_SERVING until a commit completes, and neither runs nor recovers the refused task once the commit does complete', async () => {
    const dir = join(base, 'journal');
    const hang = join(base, 'hang');
    const config = join(base, 'config.json');
    writeFileSync(config, JSON.stringify({ journal: { dir, commitTimeoutMs: 1_500 } }));
    const server = await spawnServe(['--fake-engine', '--config', config], { LD_PRELOAD: library, S39_HANG_FILE: hang, S39_HANG_DIR: dir });
    servers.push(server);
    const client = new RolloutClient(server.address);
    try {
      expect((await client.submit(mathTask('before', 1, 1))).duplicate).toBe(false);

      writeFileSync(hang, 'hang');
      // Before the fix: no answer at all (the submit waited on the fsync for good).
      const refused = await within(refusal(client.submit(mathTask('hung', 2, 2))), 60_000, 'the submit during the hang');
      expect(refused, 'a task whose record never became durable was answered accepted').toBeDefined();
      expect(refused!.code, refused!.details).toBe(status.UNAVAILABLE);
      expect(refused!.details).toBe(`the journal could not record the task: journal commit did not complete in 1.5 s at ${join(dir, 'data.mdb')}`);
      expect(await healthStatuses(server.address, undefined, WATCHED)).toEqual({ '': 'SERVING', 'rollout.v1.RolloutService': 'NOT_SERVING', 'rollout.admission': 'NOT_SERVING' });
      await eventually(() => server.logs('journal cannot commit: RolloutService NOT_SERVING until a commit succeeds again').length > 0, 'the cannot-commit log line', 30_000);
      expect(server.logs('journal cannot commit: RolloutService NOT_SERVING until a commit succeeds again')).toEqual([
        expect.objectContaining({ level: 50, reason: `journal commit did not complete in 1.5 s at ${join(dir, 'data.mdb')}` }),
      ]);
      // The refused task is not the server's: it has no trajectory to give.
      await expect(client.getTrajectory('hung')).rejects.toMatchObject({ code: status.NOT_FOUND });

      // The disk comes back: the hung commit (which holds the refused task's record) completes after all.
      rmSync(hang);
      await eventually(async () => (await healthStatuses(server.address, undefined, WATCHED))['rollout.v1.RolloutService'] === 'SERVING', 'RolloutService SERVING again', 60_000);
      await eventually(() => server.logs('journal commits again: RolloutService SERVING').length > 0, 'the commits-again log line', 30_000);
      expect(server.logs('journal commits again: RolloutService SERVING')).toHaveLength(1);
      // Still not run, not held: a submit of it now is a new task, not a duplicate of the one refused.
      await expect(client.getTrajectory('hung')).rejects.toMatchObject({ code: status.NOT_FOUND });
      expect((await client.submit(mathTask('after', 1, 3))).duplicate).toBe(false);
    } finally {
      client.close();
    }
    // A crash now: what recovery would rebuild must not hold the refused task (its record did reach the disk).
    server.kill();
    await server.exited;
    const { journal, contents } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    try {
      expect(contents.tasks.map((t) => t.taskId).sort()).toEqual(['after', 'before']);
    } finally {
      await journal.close();
    }
  }, 240_000);
});
