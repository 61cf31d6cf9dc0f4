import { rmSync } from 'node:fs';
import { afterAll, describe, expect, it } from 'vitest';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from './helpers.js';
import { busyboxRoot, STATIC_BUSYBOX } from './review-s37-busybox-root.js';

/** `N -> target` of each descriptor in an `ls -l /proc/PID/fd` listing. */
function descriptors(listing: string): Map<number, string> {
  const out = new Map<number, string>();
  for (const line of listing.split('\n')) {
    const m = / (\d+) -> (.*)$/.exec(line);
    if (m) out.set(Number(m[1]), m[2]!);
  }
  return out;
}

// The shell's own descriptors (`; true`: sh must not exec ls in its place).
const LIST = 'ls -l /proc/$$/fd; true';

async function spawned(sandbox: Sandbox): Promise<string> {
  const proc = sandbox.spawn(['sh', '-c', LIST]);
  let out = '';
  proc.stdout.on('data', (c: Buffer) => (out += c.toString()));
  proc.stdin.end();
  await proc.exited;
  await new Promise<void>((resolve) => (proc.stdout.readableEnded ? resolve() : proc.stdout.once('end', () => resolve())));
  return out;
}

const busybox = STATIC_BUSYBOX === undefined ? undefined : busyboxRoot();
afterAll(() => busybox !== undefined && rmSync(busybox, { recursive: true, force: true }));
const layouts: Array<[string, string | undefined]> = [['the host layout (dash as sh, bash there)', undefined]];
if (busybox !== undefined) layouts.push(['a busybox image (ash as sh, no bash)', busybox]);

// Review s37: without the sandbox init (not built: the fallback), the sandbox's shell closed the namespace descriptors
// nsenter is given (4..11) only up to 9 (POSIX sh names no other), so every command, spawned process and shell of the
// sandbox held the sandbox's cgroup namespace (10) and a directory descriptor of its root (11), opened by the host.
describe.each(layouts)('bubblewrap without the sandbox init, %s: commands get 0, 1 and 2 only', (_name, image) => {
  const driver = closeAfterAll(new BubblewrapDriver({ init: false }));
  let sandbox: Sandbox | undefined;
  afterAll(() => sandbox?.stop());

  it('one-shot exec and spawned process', async () => {
    sandbox = await driver.start(testSpec({ wallClockMs: 120_000, ...(image !== undefined && { image }) }));
    const exec = descriptors((await sandbox.exec(['sh', '-c', LIST])).stdout);
    expect([...exec.entries()].sort((a, b) => a[0] - b[0]).filter(([fd]) => fd > 2)).toEqual([]);
    const spawn = descriptors(await spawned(sandbox));
    expect([...spawn.entries()].sort((a, b) => a[0] - b[0]).filter(([fd]) => fd > 2)).toEqual([]);
  }, 60_000);

  it('the closer adds nothing to the environment (bash, which it may run, exports SHLVL)', async () => {
    const env = (await sandbox!.exec(['env'])).stdout;
    if (image === undefined) expect(env).not.toMatch(/^SHLVL=/m);
    expect(env).toMatch(/^PATH=/m);
  });
});
