import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { eventually, within } from '../support/wait.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

describe('the root logger when stdout has no reader any more', () => {
  // Before the fix: pino's default destination writes asynchronously, and on exit flushes what it buffered with
  // sonic-boom's flushSync, which retries every error other than EAGAIN every 100 ms without end — on EPIPE, for
  // good. `serve | head` then never exited on its third signal (the "exit at once"): a process left to SIGKILL.
  it('a process that exits with log lines written after its stdout reader left exits (no retry loop on EPIPE)', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'test/cli/review-s39-log-epipe-child.ts'], { cwd: root, stdio: ['pipe', 'pipe', 'pipe'] });
    try {
      let err = '';
      child.stderr.on('data', (d: Buffer) => (err += d.toString()));
      const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
      await eventually(() => err.includes('ready\n'), 'the child to be ready', 60_000);
      child.stdout.destroy(); // the reader of its stdout is gone (`| head` exited)
      child.stdin.write('go\n');
      expect(await within(exited, 30_000, 'the child to exit'), err).toEqual({ code: 1, signal: null });
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  }, 120_000);
});
