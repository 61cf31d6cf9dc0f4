// A process logging through the server's root logger (createLogger: pino to stdout) that exits with log lines still
// buffered after its stdout's reader went away — what `rollout serve | head` does when the operator's third signal
// (serve.ts hardExit: logger.fatal, then process.exit) comes before pino saw the broken pipe.
// Protocol: prints "ready" on stderr; the parent closes its end of our stdout, then writes a line to our stdin.
import { createLogger } from '../../src/observability/logger.js';

const log = createLogger({ level: 'info' });
log.info('before the reader left');
process.stdin.once('data', () => {
  log.info('after the reader left');
  log.fatal('exiting at once');
  process.exit(1);
});
process.stderr.write('ready\n');
