import { spawn } from 'node:child_process';
import { accessSync, chmodSync, constants, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findMathVerify } from '../../src/environments/math/math-verify-checker.js';
import { defaultImagePath } from '../../src/sandboxes/images/image-recipe.js';

// Review s39: the WHOLE server as a user that is not root ("init starts a rootless sandbox"): the real `rollout serve`
// (fake vLLM engine, a test double; default bubblewrap sandboxes; a journal) as an unused uid, math tasks through the
// TypeScript client, the scripted agent running python in the sandbox. review-s39-rootless.test.ts covers the driver
// alone; this one the server, its journal, the image mount and the math checker.
//
// A .sif image is mounted with squashfuse, which as a non-root user needs /dev/fuse read-write for it and the setuid
// fusermount3 — which refuses a uid without a passwd entry (arbitrary container uids). Before, those two ended every
// sample SANDBOX_ERROR with only squashfuse's own words ("fuse: failed to open /dev/fuse: Permission denied",
// "fusermount3: could not determine username"); now the error says what the server's user lacks and what to do.
// And `serve --math-checker X` (root or not) did not end on SIGTERM: its registry used the math environment's shared
// checker pool, which nobody closed, and that thread kept the process alive after "rollout server stopped".
//
// The test process is root here (as in CI); each stand-in (review-s39-rootless-server-cli.ts) runs under
// `setpriv --reuid` in a private mount namespace of its own (unshare -m) whose /dev/fuse is a node of the same device
// with the mode the case needs (distributions ship crw-rw-rw-; this container crw-------) and whose /etc/passwd has an
// entry for the uid or not. The host's /dev and /etc are untouched.

const UID = 4242;
const setprivPath = ['/usr/bin/setpriv', '/bin/setpriv', '/usr/sbin/setpriv'].find((p) => {
  try {
    accessSync(p, constants.X_OK);
    return true;
  } catch {
    return false;
  }
});
const skipReason =
  process.getuid?.() !== 0 ? 'the test process is not root (it needs root to run a server stand-in as another uid)'
  : setprivPath === undefined ? 'setpriv (util-linux) is not installed'
  : undefined;
// Under CI (which runs tests as root) with setpriv there, nothing skips: a non-root test process fails instead.
const skip = skipReason !== undefined && !(process.env.CI === 'true' && setprivPath !== undefined);
const skipNote = skip ? ` — SKIPPED: ${skipReason}` : '';

const root = fileURLToPath(new URL('../..', import.meta.url));
const cli = fileURLToPath(new URL('./review-s39-rootless-server-cli.ts', import.meta.url));
const image = existsSync(defaultImagePath()) ? defaultImagePath() : undefined;
const onPath = (tool: string): boolean => ['/usr/local/bin', '/usr/bin', '/bin'].some((d) => existsSync(join(d, tool)));
// The image cases need the project's .sif (scripts/setup.sh builds it), squashfuse and a FUSE device to stand in for.
const imageSkip = image === undefined ? 'no .sif image (scripts/setup.sh builds it)'
  : !onPath('squashfuse') || !onPath('fusermount3') ? 'squashfuse or fusermount3 is not installed'
  : !existsSync('/dev/fuse') ? 'the host has no /dev/fuse'
  : undefined;
const imageNote = imageSkip === undefined ? '' : ` — SKIPPED: ${imageSkip}`;
const hasEntry = readFileSync('/etc/passwd', 'utf8').split('\n').some((l) => l.split(':')[2] === String(UID));
// The host case grades with the built-in checker (its threads), the image case with math-verify where it is installed.
const imageChecker = findMathVerify() !== undefined ? 'math-verify' : 'builtin';

interface Sample {
  taskId: string;
  sampleIndex: number;
  status: string;
  finishReason: string;
  error: string;
  reward: number;
  roles: string[];
}
interface Report {
  uid: number;
  trajectories: Sample[];
  journalOwners: Record<string, number>;
  drained: boolean;
  signals: number;
  exitCode: number | null;
  serveLog: string;
}

let home: string;
let passwd: string;

/** Runs the stand-in as UID with /dev/fuse of `fuseMode` and, when `entry`, a passwd entry for UID. */
async function standIn(name: string, opts: { image: string | undefined; fuseMode: string; entry: boolean; checker?: string }): Promise<Report> {
  const dir = join(home, name);
  mkdirSync(dir, { mode: 0o777 });
  chmodSync(dir, 0o777);
  const asUser = [setprivPath!, `--reuid=${UID}`, `--regid=${UID}`, '--clear-groups', '--', process.execPath, '--import', 'tsx', cli, dir, opts.image ?? '-', opts.checker ?? 'builtin'];
  const fuse = existsSync('/dev/fuse');
  const argv = [
    'unshare', '--mount', '--propagation', 'private', '/bin/sh', '-c',
    '{ [ "$3" = none ] || { mknod "$1/fuse-$4" c 10 229 && chmod "$3" "$1/fuse-$4" && mount --bind "$1/fuse-$4" /dev/fuse; }; } && ' +
      '{ [ "$2" = no ] || mount --bind "$1/passwd" /etc/passwd; } && shift 4 && exec "$@"',
    'rootless-server', home, opts.entry ? 'yes' : 'no', fuse ? opts.fuseMode : 'none', name, ...asUser,
  ];
  const child = spawn(argv[0]!, argv.slice(1), {
    cwd: root, env: { PATH: `${join(process.execPath, '..')}:/usr/local/bin:/usr/bin:/bin`, HOME: home, TMPDIR: home, LANG: 'C.UTF-8' }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
  if (code !== 0) throw new Error(`the stand-in (${name}) exited ${code}: ${stderr.slice(-3000)}`);
  return JSON.parse(stdout.trim().split('\n').pop()!) as Report;
}

const completedWithRewards = (report: Report): void => {
  expect(report.uid).toBe(UID);
  expect(report.trajectories.map((t) => `${t.taskId}#${t.sampleIndex}`)).toEqual(['rootless-0#0', 'rootless-0#1', 'rootless-1#0', 'rootless-1#1']);
  for (const t of report.trajectories) {
    expect(t, report.serveLog).toMatchObject({ status: 'TRAJECTORY_STATUS_COMPLETED', finishReason: 'answer', error: '' });
    // The scripted agent called the python tool (run in the sandbox) and answered from its output.
    expect(t.roles).toContain('ROLE_TOOL');
  }
  // Rewards came from the checker: the scripted agent answers right most of the time (wrongAnswerRate 0.2).
  expect(report.trajectories.some((t) => t.reward === 1)).toBe(true);
  for (const t of report.trajectories) expect([0, 1]).toContain(t.reward);
  // The journal was written by the server's user, and SIGTERM drained and stopped the server.
  expect(Object.keys(report.journalOwners).sort()).toEqual(['data.mdb', 'lock.mdb']);
  expect(new Set(Object.values(report.journalOwners))).toEqual(new Set([UID]));
  expect(report.drained).toBe(true);
  // ... and the process ended on that one signal, exit 0 (with --math-checker its checker thread kept it alive).
  expect({ signals: report.signals, exitCode: report.exitCode }).toEqual({ signals: 1, exitCode: 0 });
};

describe.skipIf(skip)(`the whole server run by a user that is not root${skipNote}`, () => {
  beforeAll(() => {
    home = mkdtempSync(join(tmpdir(), 'rootless-server-'));
    chmodSync(home, 0o777);
    passwd = join(home, 'passwd');
    writeFileSync(passwd, `${readFileSync('/etc/passwd', 'utf8').replace(/\n?$/, '\n')}rollout:x:${UID}:${UID}:rollout:/nonexistent:/usr/sbin/nologin\n`);
    chmodSync(passwd, 0o644);
  });

  afterAll(() => {
    if (home) rmSync(home, { recursive: true, force: true });
  });

  it('serves math tasks in host-layout sandboxes (no image, no FUSE): trajectories COMPLETED with rewards', async () => {
    completedWithRewards(await standIn('host', { image: undefined, fuseMode: '0600', entry: true }));
  }, 180_000);

  describe.skipIf(imageSkip !== undefined)(`with the project's .sif image${imageNote}`, () => {
    it('serves math tasks in the image, mounted with squashfuse by the server\'s user', async () => {
      completedWithRewards(await standIn('sif', { image, fuseMode: '0666', entry: true, checker: imageChecker }));
    }, 180_000);

    it('a /dev/fuse the server\'s user cannot open: SANDBOX_ERROR saying so and what to do, not reward 0', async () => {
      const report = await standIn('no-fuse', { image, fuseMode: '0600', entry: true });
      expect(report.trajectories).toHaveLength(4);
      for (const t of report.trajectories) {
        expect(t.status).toBe('TRAJECTORY_STATUS_SANDBOX_ERROR');
        expect(t.error).toMatch(/\/dev\/fuse/);
        expect(t.error).toContain(`uid ${UID}`);
        expect(t.error).toMatch(/crw-rw-rw-/);
        expect(t.error).toMatch(/image directory/);
      }
      expect(report.drained).toBe(true);
    }, 180_000);

    it.skipIf(hasEntry)('a uid without a passwd entry: SANDBOX_ERROR naming the missing entry, not reward 0', async () => {
      const report = await standIn('no-entry', { image, fuseMode: '0666', entry: false });
      expect(report.trajectories).toHaveLength(4);
      for (const t of report.trajectories) {
        expect(t.status).toBe('TRAJECTORY_STATUS_SANDBOX_ERROR');
        expect(t.error).toMatch(/passwd entry/);
        expect(t.error).toContain(`uid ${UID}`);
        expect(t.error).toMatch(/image directory/);
      }
      expect(report.drained).toBe(true);
    }, 180_000);
  });
});
