import { describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import type { SandboxLimits } from '../../src/sandboxes/types.js';
import { closeAfterAll, sandboxesStoppedAfterEach } from './helpers.js';

const driver = closeAfterAll(new BubblewrapDriver());
const startSandbox = sandboxesStoppedAfterEach<BubblewrapSandbox>();
const start = (overrides: Partial<SandboxLimits> = {}): Promise<BubblewrapSandbox> => startSandbox(driver, overrides);

/** Replaces /work/x by a FIFO and back by a regular file, as fast as it can, in the background. */
const SWAPPER = `
import os
os.chdir("/work")
while True:
    try:
        os.mkfifo(".f")
    except FileExistsError:
        pass
    os.replace(".f", "x")
    with open(".r", "w") as f:
        f.write("hello\\n")
    os.replace(".r", "x")
`;

// Review s35: writeFile checked that the path was a regular file (or absent), then opened it for writing: a FIFO the
// program put there in between blocked the open until the command timeout, and the write failed as
// deadline_exceeded — the editor's or the python tool's call, and so the trajectory, ended as an infrastructure
// timeout for what the model did in its own workspace.
describe('writeFile on a path the program keeps swapping between a file and a FIFO', () => {
  it('never blocks on the FIFO: each write succeeds or is refused as the path\'s fault, at once', async () => {
    const sandbox = await start({ commandTimeoutMs: 3_000, wallClockMs: 120_000 });
    sandbox.spawn(['python3', '-c', SWAPPER]);
    const outcomes = new Set<string>();
    for (let i = 0; i < 60; i++) {
      const started = performance.now();
      const code = await sandbox.writeFile('x', `edit ${i}\n`).then(
        () => 'ok',
        (err: unknown) => (err instanceof RolloutError ? err.code : String(err)),
      );
      outcomes.add(code);
      expect(code).toMatch(/^(ok|invalid_argument)$/);
      expect(performance.now() - started).toBeLessThan(2_500);
    }
    expect(outcomes.has('ok')).toBe(true);
  }, 120_000);
});
