import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { status, type ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { mathTask } from '../support/harness.js';
import { healthStatuses } from '../support/health.js';
import { spawnServe, type ServeProcess } from '../support/rollout-process.js';
import { startServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

/**
 * A fault-injecting DOUBLE of libc's fsync and fdatasync, loaded into the server with LD_PRELOAD (the same seam as
 * review-s37-fsync-faults: LMDB's native commit syncs before it writes its meta page). While the file $S38_FAULT_FILE
 * exists, a sync of a file under $S38_FAULT_DIR fails with EIO; every other call passes through.
 */
const FSYNC_FAULT_DOUBLE = String.raw`
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static int faulted(int fd) {
  const char *flag = getenv("S38_FAULT_FILE"), *dir = getenv("S38_FAULT_DIR");
  if (!flag || !dir || access(flag, F_OK) != 0) return 0;
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = 0;
  return strncmp(path, dir, strlen(dir)) == 0;
}
#define DOUBLE(name) int name(int fd) { \
  static int (*real)(int); \
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, #name); \
  if (faulted(fd)) { errno = EIO; return -1; } \
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

describe.skipIf(!hasCompiler())('a journal whose disk returns EIO (LD_PRELOAD fault double at LMDB\'s sync calls)', () => {
  let base: string;
  let library: string;
  const servers: ServeProcess[] = [];
  beforeAll(() => {
    base = mkdtempSync(join(tmpdir(), 'rollout-s38-eio-'));
    writeFileSync(join(base, 'fsync-fault-double.c'), FSYNC_FAULT_DOUBLE);
    library = join(base, 'fsync-fault-double.so');
    execFileSync('gcc', ['-shared', '-fPIC', '-O1', '-o', library, join(base, 'fsync-fault-double.c'), '-ldl']);
  });
  afterAll(async () => {
    for (const s of servers) s.kill();
    await Promise.all(servers.map((s) => s.exited));
    if (base) rmSync(base, { recursive: true, force: true });
  });

  it('says NOT_SERVING for RolloutService while it cannot commit and SERVING again once a commit succeeds (probed, no submit needed); the client and the log get one line naming the cause and the file', async () => {
    const dir = join(base, 'journal');
    const fault = join(base, 'fault');
    const server = await spawnServe(['--fake-engine', '--journal-dir', dir], { LD_PRELOAD: library, S38_FAULT_FILE: fault, S38_FAULT_DIR: dir });
    servers.push(server);
    const client = new RolloutClient(server.address);
    try {
      expect((await client.submit(mathTask('before', 1, 1))).duplicate).toBe(false);
      expect(await healthStatuses(server.address, undefined, WATCHED)).toEqual({ '': 'SERVING', 'rollout.v1.RolloutService': 'SERVING', 'rollout.admission': 'SERVING' });

      writeFileSync(fault, 'EIO');
      const refused = await client.submit(mathTask('during', 1, 2)).then(
        () => undefined,
        (err: unknown) => err as ServiceError,
      );
      expect(refused, 'a task whose record could not be made durable was answered accepted').toBeDefined();
      expect(refused!.code, refused!.details).toBe(status.UNAVAILABLE);
      // One line: the errno by name, its text, and the file — not lmdb's bare strerror.
      expect(refused!.details).toBe(`the journal could not record the task: EIO (input/output error) at ${join(dir, 'data.mdb')}`);

      // Before the fix: SERVING throughout, so a balancer kept routing tasks to a server refusing every one.
      expect(await healthStatuses(server.address, undefined, WATCHED)).toEqual({ '': 'SERVING', 'rollout.v1.RolloutService': 'NOT_SERVING', 'rollout.admission': 'NOT_SERVING' });
      await eventually(() => server.logs('journal cannot commit: RolloutService NOT_SERVING until a commit succeeds again').length > 0, 'the cannot-commit log line', 30_000);
      expect(server.logs('journal cannot commit: RolloutService NOT_SERVING until a commit succeeds again')).toEqual([
        expect.objectContaining({ level: 50, reason: `journal write failed: EIO (input/output error) at ${join(dir, 'data.mdb')}` }),
      ]);
      // Before the fix: lmdb's console.error printed the error with its stack, outside the JSON log.
      const stray = server.output().split('\n').filter((l) => l !== '' && !l.startsWith('{') && !/^rollout server listening on /.test(l));
      expect(stray).toEqual([]);
      expect(server.output()).not.toMatch(/node_modules\/lmdb/);

      // The disk syncs again: nobody submits (a balancer sends nothing to NOT_SERVING), yet the probe finds out.
      rmSync(fault);
      await eventually(async () => (await healthStatuses(server.address, undefined, WATCHED))['rollout.v1.RolloutService'] === 'SERVING', 'RolloutService SERVING again', 60_000);
      expect(await healthStatuses(server.address, undefined, WATCHED)).toEqual({ '': 'SERVING', 'rollout.v1.RolloutService': 'SERVING', 'rollout.admission': 'SERVING' });
      expect(server.logs('journal commits again: RolloutService SERVING')).toHaveLength(1);
      expect((await client.submit(mathTask('after', 1, 3))).duplicate).toBe(false);
      expect(server.child.exitCode).toBeNull();
    } finally {
      client.close();
    }
  }, 180_000);

});

describe('rollout.admission while the server drains', () => {
  it('says NOT_SERVING from the moment draining begins (admission stopped), with a healthy journal, and is not turned back by a journal event', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-s38-drain-'));
    // The engine answers after 60 s: the task stays in flight, so the drain stays in `draining`.
    const h = await startServerHarness({ config: { journal: { dir } }, engine: { requestLatencyMs: () => 60_000 } });
    try {
      await h.client.submit(mathTask('in-flight', 1, 1));
      expect((await healthStatuses(h.server.address, undefined, WATCHED))['rollout.admission']).toBe('SERVING');
      const drained = h.server.drain({ graceMs: 120_000 });
      await eventually(() => h.server.lifecycle.state === 'draining', 'draining', 10_000);
      // Before the fix: SERVING (only the services the drain names went NOT_SERVING).
      expect(await healthStatuses(h.server.address, undefined, WATCHED)).toEqual({ '': 'NOT_SERVING', 'rollout.v1.RolloutService': 'NOT_SERVING', 'rollout.admission': 'NOT_SERVING' });
      // Compaction making room (what turns admission back on while running) must not say SERVING now.
      await h.server.journal!.compact();
      h.server.journal!.onFullChange?.(undefined);
      expect(await healthStatuses(h.server.address, undefined, WATCHED)).toEqual({ '': 'NOT_SERVING', 'rollout.v1.RolloutService': 'NOT_SERVING', 'rollout.admission': 'NOT_SERVING' });
      await h.server.drain({ graceMs: 0 });
      await drained;
    } finally {
      await h.close();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);
});

describe('RolloutService health when the journal directory is removed while the server runs', () => {
  it('says NOT_SERVING for RolloutService and rollout.admission once the journal is gone (every task would be refused until a restart)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-s38-gone-'));
    const h = await startServerHarness({ config: { journal: { dir } } });
    try {
      await h.client.submit(mathTask('before', 1, 1));
      rmSync(dir, { recursive: true, force: true });
      await expect(h.client.submit(mathTask('after', 1, 2))).rejects.toMatchObject({ code: status.UNAVAILABLE });
      expect(await healthStatuses(h.server.address, undefined, WATCHED)).toEqual({ '': 'SERVING', 'rollout.v1.RolloutService': 'NOT_SERVING', 'rollout.admission': 'NOT_SERVING' });
    } finally {
      await h.close();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
