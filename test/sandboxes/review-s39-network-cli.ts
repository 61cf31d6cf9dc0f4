// Started by review-s39-isolated-network.test.ts as a server stand-in that dies by SIGKILL: starts one `network: true`
// bubblewrap sandbox, prints the pid of the slirp4netns the driver started for it (from the driver's log), then waits.
import { Writable } from 'node:stream';
import { createLogger } from '../../src/observability/logger.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import { testSpec } from './helpers.js';

let slirpPid: number | undefined;
const destination = new Writable({
  write(chunk: Buffer, _enc, done) {
    for (const line of chunk.toString().split('\n')) {
      if (!line.trim()) continue;
      const entry = JSON.parse(line) as { msg?: string; slirpPid?: number };
      if (entry.msg === 'sandbox started') slirpPid = entry.slirpPid;
    }
    done();
  },
});
const driver = new BubblewrapDriver({ logger: createLogger({ level: 'debug', destination }) });
await driver.start(testSpec({ network: true }));
process.stdout.write(`${slirpPid ?? 'none'}\n`);
setInterval(() => undefined, 1 << 30);
