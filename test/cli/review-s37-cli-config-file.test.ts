import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../../', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'rollout-cli-config-file-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Runs bin/rollout.js; a run still alive after `killAfterMs` is SIGKILLed and reported as exit code 'hung'. */
function rollout(args: string[], killAfterMs = 30_000): Promise<{ code: number | null | 'hung'; out: string }> {
  const env: NodeJS.ProcessEnv = { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' };
  delete env.ROLLOUT_TOKEN;
  delete env.ROLLOUT_ADMIN_TOKEN;
  const child: ChildProcess = spawn(process.execPath, ['bin/rollout.js', ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  let hung = false;
  const timer = setTimeout(() => {
    hung = true;
    child.kill('SIGKILL');
  }, killAfterMs);
  return new Promise((resolve) =>
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code: hung ? 'hung' : code, out });
    }),
  );
}

/** A stack trace line. */
const STACK = /\n\s+at .*\.(ts|js):\d+/;

describe('`serve --config` on something that is not a config file: one line naming it, exit 2, never a hang', () => {
  // A FIFO nothing writes to (it blocked the synchronous read for good; SIGTERM did not end it either): since review-s38
  // a pipe is read with a 30 s deadline, tested there (review-s38-config-pipe: the exact line, exit 2, and a SIGTERM
  // during the wait).
  it('a directory, and a file far larger than any config', async () => {
    const directory = join(dir, 'config.d');
    mkdirSync(directory);
    const dirRun = await rollout(['serve', '--port', '0', '--config', directory]);
    expect({ code: dirRun.code, stack: STACK.test(dirRun.out) }).toEqual({ code: 2, stack: false });
    expect(dirRun.out).toContain(`rollout: config file ${directory} is not a regular file (a directory)`);
    const huge = join(dir, 'huge.json');
    writeFileSync(huge, Buffer.alloc((16 << 20) + 1, 0x20));
    const hugeRun = await rollout(['serve', '--port', '0', '--config', huge]);
    expect({ code: hugeRun.code, stack: STACK.test(hugeRun.out) }).toEqual({ code: 2, stack: false });
    expect(hugeRun.out).toMatch(/^rollout: config file .*huge\.json is 16777217 bytes, more than a config's 16777216/m);
  }, 60_000);
});

describe('`demo` and `serve` numbers out of range are refused naming the flag (exit 2), not run', () => {
  // Regression: --group-size 0 started everything and died with a TaskRejectedError stack trace (exit 1).
  it.each([
    [['demo', '--group-size', '0'], "option '--group-size <n>' argument '0' is invalid. must be between 1 and 256, not 0"],
    [['demo', '--group-size', '300'], "option '--group-size <n>' argument '300' is invalid. must be between 1 and 256, not 300"],
    [['demo', '--groups', '-1'], "option '--groups <n>' argument '-1' is invalid. must be between 1 and 100000, not -1"],
    [['demo', '--latency-ms', '-1'], "option '--latency-ms <ms>' argument '-1' is invalid. must be between 0 and 2147483647, not -1"],
    [['serve', '--fake-engine', '--fake-latency-ms', '-1'], "option '--fake-latency-ms <ms>' argument '-1' is invalid. must be between 0 and 2147483647, not -1"],
  ])('%j', async (args, message) => {
    const r = await rollout(args);
    expect({ code: r.code, stack: STACK.test(r.out) }).toEqual({ code: 2, stack: false });
    expect(r.out).toContain(`rollout: ${message}`);
    expect(r.out).not.toContain('demo: server');
  }, 60_000);
});

describe('a config section that is not an object, with a flag merged into it', () => {
  // Regression: `"metrics": 5` spread into {} under --metrics-port: the file's value vanished and the server started.
  it('"metrics": 5 with --metrics-port is refused naming metrics', async () => {
    const config = join(dir, 'metrics-number.json');
    writeFileSync(config, JSON.stringify({ metrics: 5 }));
    const r = await rollout(['serve', '--port', '0', '--metrics-port', '0', '--config', config]);
    expect({ code: r.code, stack: STACK.test(r.out) }).toEqual({ code: 2, stack: false });
    expect(r.out).toMatch(/expected object, received number\n\s+→ at metrics/);
    expect(r.out).not.toContain('rollout server listening');
  }, 60_000);
});
