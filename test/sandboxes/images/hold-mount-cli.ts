// Acquires a .sif with SifImageMounts under a given mount root, prints the mounted root and then holds it until
// killed: the test kills it with SIGKILL to leave a stale mount behind, as a crashed server would.
import { SifImageMounts } from '../../../src/sandboxes/images/sif-mount.js';

const [mountRoot, image] = process.argv.slice(2);
const images = new SifImageMounts({ mountRoot, graceMs: 0 });
const mounted = await images.acquire(image ?? '');
process.stdout.write(`${mounted.root}\n`);
setInterval(() => undefined, 60_000);
