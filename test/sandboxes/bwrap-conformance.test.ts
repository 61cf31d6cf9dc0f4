import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll } from 'vitest';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import { defaultImagePath } from '../../src/sandboxes/images/image-recipe.js';
import { describeSandboxConformance } from './conformance.js';
import { describeShellConformance, shellTestLimits } from './shell-conformance.js';
import { closeAfterAll, testSpec } from './helpers.js';

// The driver-agnostic suites (the ones Apptainer runs too) on the long-lived bubblewrap sandbox: the host layout,
// and the project's own .sif image (built by scripts/setup.sh; in CI its absence is a failure, not a skip).
const image = defaultImagePath();
const imageSkip = existsSync(image) || process.env.CI ? undefined : `no default image at ${image} (run scripts/setup.sh)`;

/**
 * A TEST DOUBLE of the sandbox init (init/sandbox-init.c) for the killed-reader test: a holder that says it is up and
 * waits for its control pipe to close, a descriptor "closer" that closes nothing, a writer that is `cat`, no devpts
 * mount (the driver then warns), and a `--read-file` that SIGKILLs itself, a stand-in for the OOM killer.
 */
const killedReaderDir = mkdtempSync(join(tmpdir(), 'bwrap-conformance-'));
const killedReaderInit = join(killedReaderDir, 'killed-reader-init');
writeFileSync(killedReaderInit, [
  '#!/bin/sh',
  'case $1 in',
  '  --read-file) kill -KILL $$ ;;',
  '  --keep-fds) shift 3; exec "$@" ;;',
  '  --write-file) exec cat > "$3" ;;',
  '  --mount-devpts) exit 1 ;;',
  "  '') printf r; while read -r _; do :; done; exit 0 ;;",
  'esac',
  'exit 125',
  '',
].join('\n'), { mode: 0o755 });
const killedReaderDrivers: BubblewrapDriver[] = [];
const makeKilledReaderDriver = (): BubblewrapDriver => {
  const driver = new BubblewrapDriver({ init: killedReaderInit });
  killedReaderDrivers.push(driver);
  return driver;
};
afterAll(async () => {
  await Promise.all(killedReaderDrivers.map((d) => d.close()));
  rmSync(killedReaderDir, { recursive: true, force: true });
});

describeSandboxConformance('bubblewrap, host layout', () => new BubblewrapDriver(), { makeKilledReaderDriver });
describeSandboxConformance('bubblewrap, the default .sif image', () => new BubblewrapDriver(), { image, makeKilledReaderDriver, ...(imageSkip !== undefined && { skip: imageSkip }) });

const shellDriver = closeAfterAll(new BubblewrapDriver());
describeShellConformance('bubblewrap, host layout', () => shellDriver.start(testSpec(shellTestLimits)));
if (imageSkip === undefined) describeShellConformance('bubblewrap, the default .sif image', () => shellDriver.start(testSpec({ ...shellTestLimits, image })));
