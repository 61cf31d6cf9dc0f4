import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { status, type ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { spawnServe, type ServeProcess } from '../support/rollout-process.js';
import { eventually } from '../support/wait.js';

/**
 * A fault-injecting DOUBLE of libc's fsync and fdatasync, loaded into the server with LD_PRELOAD: the journal's seam to
 * the disk is LMDB's native commit (lmdb-js's addon calls fdatasync/fsync before a commit's meta page is written), not
 * anything in JavaScript. While the file $S37_FAULT_FILE exists, a sync of a file under $S37_FAULT_DIR fails with the
 * errno written in it (EIO: what a disk's write-back error, or thin provisioning running out, reports at fsync); every
 * other call passes through. The writes themselves succeed: only their durability fails, as on a real device.
 */
const FSYNC_FAULT_DOUBLE = String.raw`
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int faulted(int fd) {
  const char *flag = getenv("S37_FAULT_FILE"), *dir = getenv("S37_FAULT_DIR");
  if (!flag || !dir) return 0;
  FILE *f = fopen(flag, "r");
  if (!f) return 0;
  int code = 0;
  if (fscanf(f, "%d", &code) != 1 || code <= 0) code = EIO;
  fclose(f);
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = 0;
  return strncmp(path, dir, strlen(dir)) == 0 ? code : 0;
}
#define DOUBLE(name) int name(int fd) { \
  static int (*real)(int); \
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, #name); \
  int code = faulted(fd); \
  if (code) { errno = code; return -1; } \
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

describe.skipIf(!hasCompiler())('a journal whose fsync fails (LD_PRELOAD fault double at LMDB\'s sync calls)', () => {
  let base: string;
  let library: string;
  const servers: ServeProcess[] = [];
  beforeAll(() => {
    base = mkdtempSync(join(tmpdir(), 'rollout-s37-fsync-'));
    writeFileSync(join(base, 'fsync-fault-double.c'), FSYNC_FAULT_DOUBLE);
    library = join(base, 'fsync-fault-double.so');
    execFileSync('gcc', ['-shared', '-fPIC', '-O1', '-o', library, join(base, 'fsync-fault-double.c'), '-ldl']);
  });
  afterAll(async () => {
    for (const s of servers) s.kill();
    await Promise.all(servers.map((s) => s.exited));
    if (base) rmSync(base, { recursive: true, force: true });
  });

  const cases = [
    { errno: 5 /* EIO */, name: 'EIO', code: status.UNAVAILABLE, details: /^the journal could not record the task: EIO \(input\/output error\) at .*data\.mdb$/ },
    { errno: 28 /* ENOSPC */, name: 'ENOSPC', code: status.RESOURCE_EXHAUSTED, details: /^the journal's disk is full: .* \(the write failed: ENOSPC \(no space left on device\)\)$/ },
  ];
  it.each(cases)('fsync failing with $name: the task is refused with a status naming the journal, never accepted; the server lives on; a restart recovers exactly what it accepted', async ({ errno, name, code, details }) => {
    const dir = join(base, `journal-${name}`);
    const fault = join(base, `fault-${name}`);
    const first = await spawnServe(['--fake-engine', '--journal-dir', dir], { LD_PRELOAD: library, S37_FAULT_FILE: fault, S37_FAULT_DIR: dir });
    servers.push(first);
    const client = new RolloutClient(first.address);
    try {
      expect((await client.submit(mathTask('before', 1, 1))).duplicate).toBe(false);
      const done = await client.getTrajectory('before', { wait: true, deadlineMs: 60_000 });
      expect(done.trajectories.map((t) => t.status)).toEqual([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED]);

      writeFileSync(fault, String(errno));
      const refused = await client.submit(mathTask('during', 1, 2)).then(
        () => undefined,
        (err: unknown) => err as ServiceError,
      );
      expect(refused, 'a task whose record could not be made durable was answered accepted').toBeDefined();
      expect(refused!.code, refused!.details).toBe(code);
      expect(refused!.details).toMatch(details);
      rmSync(fault);
      // Not a crash: the server still answers, and what it refused it does not hold.
      expect(first.child.exitCode).toBeNull();
      await expect(client.getTrajectory('during', { wait: false, deadlineMs: 10_000 })).rejects.toMatchObject({ code: status.NOT_FOUND });
      if (code === status.UNAVAILABLE) {
        // A transient failure: the next task is accepted once the disk syncs again (a full disk waits for compaction).
        expect((await client.submit(mathTask('after', 1, 3))).duplicate).toBe(false);
      }
    } finally {
      client.close();
    }
    first.child.kill('SIGKILL');
    await first.exited;

    const second = await spawnServe(['--fake-engine', '--journal-dir', dir]);
    servers.push(second);
    await eventually(() => second.logs('recovered from the journal').length > 0, 'the recovery report', 30_000);
    const accepted = code === status.UNAVAILABLE ? ['before', 'after'] : ['before'];
    expect(second.logs('recovered from the journal')[0]).toMatchObject({ tasks: accepted.length, finishedSamples: 1, quarantinedRecords: 0, lostTasks: 0 });
    const client2 = new RolloutClient(second.address);
    try {
      for (const id of accepted) {
        const got = await client2.getTrajectory(id, { wait: true, deadlineMs: 60_000 });
        expect(got.trajectories.map((t) => t.status), id).toEqual([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED]);
      }
      await expect(client2.getTrajectory('during', { wait: false, deadlineMs: 10_000 })).rejects.toMatchObject({ code: status.NOT_FOUND });
      // Refused, so the trainer submits it again: accepted now, run once.
      expect((await client2.submit(mathTask('during', 1, 2))).duplicate).toBe(false);
    } finally {
      client2.close();
    }
  }, 180_000);
});
