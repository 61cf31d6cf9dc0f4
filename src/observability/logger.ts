import { pino, type Logger } from 'pino';

export type { Logger } from 'pino';

/**
 * The root logger. Components take `logger.child({ component: 'router' })` by injection so tests can read
 * their logs; nothing logs through a global.
 *
 * Without a destination: stdout, written synchronously (pino's own standard mode). pino's default there is an
 * asynchronous sonic-boom whose exit-time flush (flushSync) retries every error but EAGAIN every 100 ms without end:
 * a process that exits with lines still buffered after its stdout's reader went away (`rollout serve | head`, then
 * the operator's third signal: logger.fatal, process.exit) never exited. Written at once, nothing is left for the
 * exit to flush, and a broken pipe is seen by the write itself, which pino then stops (its EPIPE handler). The cost
 * is a write(2) per line, and a reader that stops reading without closing (a paused pager) stalls the process
 * (sonic-boom retries EAGAIN every 100 ms) where the asynchronous stream grew its buffer without bound. A
 * process.stdout replaced (a test runner capturing it) is written through, as pino does.
 */
export function createLogger(options: { level?: string; destination?: NodeJS.WritableStream } = {}): Logger {
  const level = options.level ?? process.env.ROLLOUT_LOG_LEVEL ?? 'info';
  if (options.destination) return pino({ level }, options.destination);
  if (process.stdout.write !== Object.getPrototypeOf(process.stdout).write) return pino({ level });
  const destination = pino.destination({ dest: process.stdout.fd ?? 1, sync: true });
  // A terminal that hung up (its window closed, the ssh session dropped: `rollout serve` gets SIGHUP and drains)
  // fails every write EIO: logging stops there, as pino does for EPIPE, instead of the error being thrown from the
  // log call (it killed the drain the hang-up had started). Other errors are thrown as before.
  destination.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') return; // pino's own handler stopped the stream
    if (err.code !== 'EIO') throw err;
    destination.write = () => true;
    destination.flushSync = () => undefined;
  });
  return pino({ level }, destination);
}

/** A logger that drops everything, for tests and library use without logs. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
