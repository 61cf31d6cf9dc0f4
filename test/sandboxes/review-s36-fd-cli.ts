// Started by review-s36-inherited-fds.test.ts with extra descriptors inherited WITHOUT close-on-exec (as a harness's
// pipe reaches a server): runs `ls /proc/self/fd` through every path that starts a process in a sandbox and prints
// one JSON object of what each saw. argv[2]: `bwrap` or `apptainer:<double binary>:<double tmp root>`.
import { ApptainerDriver } from '../../src/sandboxes/apptainer.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { Sandbox, SandboxDriver } from '../../src/sandboxes/types.js';
import { testSpec } from './helpers.js';

// The descriptors of the shell itself, `N -> target` per line (`; true`: sh must not exec ls in its own place, whose
// listing would show ls's own; no pipeline: the shell would hold its pipes meanwhile).
const LIST = 'ls -l /proc/$$/fd; true';
const which = process.argv[2] ?? 'bwrap';
const bwrap = which.startsWith('bwrap');
const driver: SandboxDriver = bwrap
  ? new BubblewrapDriver(which === 'bwrap-no-init' ? { init: false } : {})
  : new ApptainerDriver({ binary: which.split(':')[1]!, tmpRoot: which.split(':')[2]! });
const sandbox: Sandbox = await driver.start(testSpec(bwrap ? {} : { image: '/' }));
const out: Record<string, string> = {};
try {
  out.exec = (await sandbox.exec(['sh', '-c', LIST])).stdout;
  const proc = sandbox.spawn(['sh', '-c', LIST]);
  let spawned = '';
  proc.stdout.on('data', (c: Buffer) => (spawned += c.toString()));
  proc.stdin.end();
  await proc.exited;
  await new Promise((resolve) => setTimeout(resolve, 100));
  out.spawn = spawned;
  if (bwrap) {
    out.shell = (await sandbox.shell().run(LIST)).output;
  }
} finally {
  await sandbox.stop();
  await driver.close?.();
}
process.stdout.write(`${JSON.stringify(out)}\n`);
