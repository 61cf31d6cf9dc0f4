import { spawnSync } from 'node:child_process';
import { afterAll, describe } from 'vitest';
import { ApptainerDriver } from '../../src/sandboxes/apptainer.js';
import { makeApptainerDouble } from './apptainer-double.js';
import { describeSandboxConformance } from './conformance.js';
import { describeShellConformance, shellTestLimits } from './shell-conformance.js';
import { closeAfterAll, testSpec } from './helpers.js';

/** `apptainer` or `singularity` when one is on PATH. */
function installedBinary(): string | undefined {
  for (const binary of ['apptainer', 'singularity']) {
    if (spawnSync('sh', ['-c', `command -v ${binary}`]).status === 0) return binary;
  }
  return undefined;
}

// The real thing, wherever it is installed: any .sif or root file system directory with sh, coreutils and findutils.
const binary = installedBinary();
const image = process.env.ROLLOUT_TEST_APPTAINER_IMAGE;
describeSandboxConformance(`apptainer (${binary ?? 'not installed'})`, () => new ApptainerDriver({ binary: binary ?? 'apptainer' }), {
  ...(binary === undefined
    ? { skip: 'neither apptainer nor singularity is on PATH' }
    : image === undefined && { skip: 'set ROLLOUT_TEST_APPTAINER_IMAGE to a .sif or sandbox directory' }),
  ...(image !== undefined && { image }),
});

// The persistent shell on real Apptainer (the double's execs have PID namespaces of their own, so the shell's
// in-sandbox interrupter could not see the shell there: it runs only on the real thing).
describe.skipIf(binary === undefined || image === undefined)(`apptainer shell (${binary === undefined ? 'skipped: not installed' : image === undefined ? 'skipped: no ROLLOUT_TEST_APPTAINER_IMAGE' : binary})`, () => {
  const driver = closeAfterAll(new ApptainerDriver({ binary: binary ?? 'apptainer' }));
  describeShellConformance('apptainer', () => driver.start(testSpec({ ...shellTestLimits, ...(image !== undefined && { image }) })));
});

// The same suite over the apptainer TEST DOUBLE (test/fixtures/apptainer-test-double.sh, bwrap-backed), so the
// driver's own process handling runs here, where Apptainer is not installed. The double ignores the image and
// runs the host's root read-only; `/` only has to exist.
const double = makeApptainerDouble();
afterAll(() => double.cleanup());
describeSandboxConformance('apptainer driver over the apptainer test double', () => new ApptainerDriver({ binary: double.binary, tmpRoot: double.tmpRoot }), {
  image: '/',
  noDiskQuota: 'the double keeps an overlay image\'s files in host dirs (its argv is checked in apptainer-driver.test.ts; the quota itself runs against a real apptainer above)',
});
