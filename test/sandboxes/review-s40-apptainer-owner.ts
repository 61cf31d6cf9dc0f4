/**
 * A process that owns Apptainer sandboxes (src/sandboxes/apptainer.ts's driver, on the apptainer TEST DOUBLE given as
 * argv[2], host dirs under argv[3]) and is then killed by the test: it starts three sandboxes, stops one, prints
 * `ready {"live": [...], "stopped": "..."}` and waits. With argv[4] = `close`, it stops the other two, closes the
 * driver (a clean shutdown), prints `closed` and waits.
 *
 * Usage: `node --import tsx test/sandboxes/review-s40-apptainer-owner.ts <apptainer binary> <tmp root> [close]`.
 */
import { ApptainerDriver } from '../../src/sandboxes/apptainer.js';
import { testSpec } from './helpers.js';

const [binary, tmpRoot, mode] = process.argv.slice(2);
const driver = new ApptainerDriver({ binary: binary!, tmpRoot: tmpRoot! });
const spec = testSpec({ image: '/' });
const sandboxes = [await driver.start(spec), await driver.start(spec), await driver.start(spec)];
await sandboxes[0]!.stop();
console.log(`ready ${JSON.stringify({ live: sandboxes.slice(1).map((s) => s.id), stopped: sandboxes[0]!.id })}`);
if (mode === 'close') {
  await Promise.all(sandboxes.slice(1).map((s) => s.stop()));
  await driver.close();
  console.log('closed');
}
setInterval(() => undefined, 1 << 30);
