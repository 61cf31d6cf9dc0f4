import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { NODE_FLAGS } from '../../src/cli/node-flags.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const run = promisify(execFile);

describe('the node flags of the rollout command', () => {
  it('are the ones benchmarks and spawned servers use, and the command runs through its shebang with them', async () => {
    const [shebang] = (await readFile(`${root}bin/rollout.js`, 'utf8')).split('\n');
    expect(shebang).toBe(`#!/usr/bin/env -S node ${NODE_FLAGS.join(' ')}`);
    // Executed as operators do (the kernel reads the shebang; `env -S` splits the flags), not as `node bin/rollout.js`.
    const { stdout } = await run(`${root}bin/rollout.js`, ['--help'], { cwd: root, timeout: 60_000 });
    expect(stdout).toMatch(/serve/);
  }, 90_000);

  it('give the young generation more room than V8 gives by default (V8 applies them)', async () => {
    // The young generation grows toward its maximum under a steady allocation of short-lived objects.
    const script =
      "let keep = []; for (let i = 0; i < 3e6; i++) { keep.push({ i, s: 'x' + i }); if (keep.length > 50000) keep = []; }" +
      "console.log(require('node:v8').getHeapSpaceStatistics().find((s) => s.space_name === 'new_space').space_size)";
    const plain = Number((await run(process.execPath, ['-e', script])).stdout);
    const flagged = Number((await run(process.execPath, [...NODE_FLAGS, '-e', script])).stdout);
    expect(flagged).toBeGreaterThan(plain);
  }, 60_000);
});
