import { pino, type Logger } from 'pino';

export type { Logger } from 'pino';

/**
 * The root logger. Components take `logger.child({ component: 'router' })` by injection so tests can read
 * their logs; nothing logs through a global.
 */
export function createLogger(options: { level?: string; destination?: NodeJS.WritableStream } = {}): Logger {
  const level = options.level ?? process.env.ROLLOUT_LOG_LEVEL ?? 'info';
  return options.destination ? pino({ level }, options.destination) : pino({ level });
}

/** A logger that drops everything, for tests and library use without logs. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
