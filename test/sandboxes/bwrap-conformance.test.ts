import { existsSync } from 'node:fs';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import { defaultImagePath } from '../../src/sandboxes/images/image-recipe.js';
import { describeSandboxConformance } from './conformance.js';
import { describeShellConformance, shellTestLimits } from './shell-conformance.js';
import { closeAfterAll, testSpec } from './helpers.js';

// The driver-agnostic suites (the ones Apptainer runs too) on the long-lived bubblewrap sandbox: the host layout,
// and the project's own .sif image (built by scripts/setup.sh; in CI its absence is a failure, not a skip).
const image = defaultImagePath();
const imageSkip = existsSync(image) || process.env.CI ? undefined : `no default image at ${image} (run scripts/setup.sh)`;

describeSandboxConformance('bubblewrap, host layout', () => new BubblewrapDriver());
describeSandboxConformance('bubblewrap, the default .sif image', () => new BubblewrapDriver(), { image, ...(imageSkip !== undefined && { skip: imageSkip }) });

const shellDriver = closeAfterAll(new BubblewrapDriver());
describeShellConformance('bubblewrap, host layout', () => shellDriver.start(testSpec(shellTestLimits)));
if (imageSkip === undefined) describeShellConformance('bubblewrap, the default .sif image', () => shellDriver.start(testSpec({ ...shellTestLimits, image })));
