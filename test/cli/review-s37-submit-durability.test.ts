import { execFileSync, spawn } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { taskIdFor } from '../../src/cli/submit-dataset.js';
import { makeMathProblem } from '../../src/testing/arithmetic.js';
import { createScriptedMathPolicy } from '../../src/testing/scripted-policy.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

/**
 * A recording DOUBLE of libc's fsync, fdatasync, rename and unlink, loaded into the CLI with LD_PRELOAD: each call on a
 * path under $S37_DIR is appended to $S37_LOG (`fsync <path>`, `rename <from> <to>`, `unlink <path>`) and then done by
 * libc. What a power loss keeps is decided by the order of these calls, which nothing in JavaScript can observe.
 */
const SYNC_RECORDER_DOUBLE = String.raw`
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void record(const char *what, const char *a, const char *b) {
  const char *dir = getenv("S37_DIR"), *log = getenv("S37_LOG");
  if (!dir || !log || !a || strncmp(a, dir, strlen(dir)) != 0) return;
  char line[9000];
  int n = snprintf(line, sizeof line, "%s %s%s%s\n", what, a, b ? " " : "", b ? b : "");
  int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd >= 0) { if (write(fd, line, n) < 0) {} close(fd); }
}
static void record_fd(const char *what, int fd) {
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return;
  path[n] = 0;
  record(what, path, NULL);
}
int fsync(int fd) { static int (*real)(int); if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync"); record_fd("fsync", fd); return real(fd); }
int fdatasync(int fd) { static int (*real)(int); if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync"); record_fd("fsync", fd); return real(fd); }
int rename(const char *a, const char *b) { static int (*real)(const char *, const char *); if (!real) real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename"); record("rename", a, b); return real(a, b); }
int unlink(const char *a) { static int (*real)(const char *); if (!real) real = (int (*)(const char *))dlsym(RTLD_NEXT, "unlink"); record("unlink", a, NULL); return real(a); }
`;

function hasCompiler(): boolean {
  try {
    execFileSync('gcc', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

function rollout(args: string[], env: Record<string, string>): Promise<{ code: number | null; output: string }> {
  const child = spawn(process.execPath, ['bin/rollout.js', ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn', ...env } });
  let output = '';
  child.stdout.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr.on('data', (d: Buffer) => (output += d.toString()));
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, output })));
}

describe.skipIf(!hasCompiler())('rollout submit makes what it renames durable before it relies on it (LD_PRELOAD recorder double)', () => {
  let h: ServerHarness;
  let dir: string;
  let library: string;
  beforeAll(async () => {
    h = await startServerHarness({ engine: { policy: createScriptedMathPolicy({ wrongAnswerRate: 0, malformedToolCallRate: 0 }) } });
    dir = mkdtempSync(join(tmpdir(), 'rollout-s37-durable-'));
    writeFileSync(join(dir, 'sync-recorder-double.c'), SYNC_RECORDER_DOUBLE);
    library = join(dir, 'sync-recorder-double.so');
    execFileSync('gcc', ['-shared', '-fPIC', '-O1', '-o', library, join(dir, 'sync-recorder-double.c'), '-ldl']);
  });
  afterAll(async () => {
    await h?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('the Parquet file is fsynced before it is renamed into place, and the rename is fsynced (its directory) before the journal holding the same trajectories is removed', async () => {
    const rows = Array.from({ length: 6 }, (_, i) => {
      const p = makeMathProblem(900 + i);
      return { problem: p.question, answer: String(p.answer) };
    });
    const dataset = join(dir, 'ds.jsonl');
    writeFileSync(dataset, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'out.parquet');
    const journal = `${output}.partial.jsonl`;
    // Every row's group already in the journal (a run interrupted after its last trajectory): this run writes the Parquet file.
    const fd = openSync(journal, 'w');
    for (const [i, row] of rows.entries()) {
      const taskId = taskIdFor(dataset, i, 'math', row, 1);
      writeSync(fd, `${JSON.stringify({ taskId, groupId: taskId, environment: 'math', status: 'TRAJECTORY_STATUS_COMPLETED', reward: 1, responseTokenIds: [1, 2, 3] })}\n`);
    }
    closeSync(fd);
    const log = join(dir, 'calls.log');
    const run = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--server', h.server.address, '--output', output], { LD_PRELOAD: library, S37_DIR: dir, S37_LOG: log });
    expect(run.code, run.output).toBe(0);
    expect(existsSync(journal)).toBe(false);
    const calls = readFileSync(log, 'utf8').split('\n').filter((l) => l !== '');
    const renamed = calls.findIndex((c) => c.startsWith('rename ') && c.endsWith(` ${output}`));
    expect(renamed, calls.join('\n')).toBeGreaterThanOrEqual(0);
    const temp = calls[renamed]!.split(' ')[1]!;
    // Not fsynced, a power loss after the rename can leave an empty or partial file under the output's name.
    expect(calls.slice(0, renamed), calls.join('\n')).toContain(`fsync ${temp}`);
    const removed = calls.indexOf(`unlink ${journal}`);
    expect(removed, calls.join('\n')).toBeGreaterThan(renamed);
    // Not fsynced, the rename may not survive a power loss that the journal's removal does: neither copy would be left.
    expect(calls.slice(renamed, removed), calls.join('\n')).toContain(`fsync ${dir}`);

    // A re-run on the finished output turns the Parquet file back into its journal first: the same rule for that rename.
    const again = join(dir, 'calls-again.log');
    const rerun = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--server', h.server.address, '--output', output], { LD_PRELOAD: library, S37_DIR: dir, S37_LOG: again });
    expect(rerun.code, rerun.output).toBe(0);
    const calls2 = readFileSync(again, 'utf8').split('\n').filter((l) => l !== '');
    const seeded = calls2.findIndex((c) => c.startsWith('rename ') && c.endsWith(` ${journal}`));
    expect(seeded, calls2.join('\n')).toBeGreaterThanOrEqual(0);
    expect(calls2.slice(0, seeded), calls2.join('\n')).toContain(`fsync ${calls2[seeded]!.split(' ')[1]!}`);
    expect(calls2.slice(seeded), calls2.join('\n')).toContain(`fsync ${dir}`);
  }, 120_000);
  it('a JSONL output rewritten to move a superseded group aside is fsynced before it is renamed over the output, and the rename is fsynced', async () => {
    const rows = Array.from({ length: 3 }, (_, i) => {
      const p = makeMathProblem(950 + i);
      return { problem: p.question, answer: String(p.answer) };
    });
    const dataset = join(dir, 'retried.jsonl');
    writeFileSync(dataset, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const output = join(dir, 'retried.out.jsonl');
    const line = (taskId: string, status: string): string => `${JSON.stringify({ taskId, groupId: taskId, environment: 'math', status, reward: 1 })}\n`;
    // Row 0's first attempt failed and its second is whole (a run killed before it moved the first aside): this run does.
    const ids = rows.map((row, i) => taskIdFor(dataset, i, 'math', row, 1));
    writeFileSync(output, line(ids[0]!, 'TRAJECTORY_STATUS_BACKEND_ERROR') + ids.map((id) => line(id === ids[0] ? `${id}-attempt2` : id, 'TRAJECTORY_STATUS_COMPLETED')).join(''));
    const log = join(dir, 'calls-retried.log');
    const run = await rollout(['submit', '--dataset', dataset, '--environment', 'math', '--server', h.server.address, '--output', output], { LD_PRELOAD: library, S37_DIR: dir, S37_LOG: log });
    expect(run.code, run.output).toBe(0);
    expect(readFileSync(output, 'utf8')).not.toContain('BACKEND_ERROR');
    const calls = readFileSync(log, 'utf8').split('\n').filter((l) => l !== '');
    const renamed = calls.findIndex((c) => c.startsWith('rename ') && c.endsWith(` ${output}`));
    expect(renamed, calls.join('\n')).toBeGreaterThanOrEqual(0);
    expect(calls.slice(0, renamed), calls.join('\n')).toContain(`fsync ${calls[renamed]!.split(' ')[1]!}`);
    expect(calls.slice(renamed), calls.join('\n')).toContain(`fsync ${dir}`);
  }, 120_000);
});
