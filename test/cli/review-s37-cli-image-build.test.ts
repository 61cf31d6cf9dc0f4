import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../../', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'rollout-cli-image-build-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const hasDebootstrap = ((): boolean => {
  try {
    execFileSync('sh', ['-c', 'command -v debootstrap || test -x /usr/sbin/debootstrap']);
    return true;
  } catch {
    return false;
  }
})();

/** A stack trace line. */
const STACK = /\n\s+at .*\.(ts|js):\d+/;

describe('`rollout image build` when debootstrap fails', () => {
  // Regression: the tool's failure was thrown as `internal` (a bug): the CLI printed it with a stack trace.
  it.skipIf(!hasDebootstrap || process.getuid?.() !== 0)('prints the tool and its own last lines on one line, exit 1, no stack trace', async () => {
    // Nothing listens on port 9 (discard) of 127.0.0.1: debootstrap fails at once, getting the Release file.
    const args = ['bin/rollout.js', 'image', 'build', '--mirror', 'http://127.0.0.1:9/debian', '--cache-dir', join(dir, 'cache'), '--packages', 'bash'];
    const child = spawn(process.execPath, args, { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' } });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 90_000);
    const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
    clearTimeout(timer);
    expect({ code, stack: STACK.test(out) }).toEqual({ code: 1, stack: false });
    expect(out).toMatch(/^rollout: debootstrap failed \(exit code \d+\): .*Failed getting release file http:\/\/127\.0\.0\.1:9\/debian/m);
  }, 120_000);
});
