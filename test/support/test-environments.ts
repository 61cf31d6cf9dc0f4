import { Writable } from 'node:stream';
import type { Environment } from '../../src/environments/types.js';
import { createLogger, type Logger } from '../../src/observability/logger.js';

/** A TEST DOUBLE environment: one turn ("Say done."), reward 1, no sandbox work. Tasks: `environment: 'quick'`. */
export const quickEnvironment: Environment<{ n: number }> = {
  name: 'quick',
  description: 'one turn, reward 1',
  instanceSchema: { type: 'object' },
  validate: () => ({ n: 0 }),
  init: async () => ({ messages: [{ role: 'user', content: 'Say done.' }] }),
  tools: () => [],
  evaluate: async () => ({ reward: 1, details: { correct: 1 }, report: {} }),
};

/** Bytes of the eval report of every `bulky` trajectory: each trajectory is about this large on the wire. */
export const BULKY_REPORT_BYTES = 512 * 1024;

/**
 * A TEST DOUBLE environment whose every trajectory carries a 512 KiB eval report (a long test log, as SWE tasks do),
 * for tests of byte bounds. Tasks: `environment: 'bulky', instance: { n }` (n starts the report).
 */
export const bulkyEnvironment: Environment<{ n: number }> = {
  name: 'bulky',
  description: 'every trajectory carries a 512 KiB report',
  instanceSchema: { type: 'object' },
  validate: (x) => ({ n: Number((x as { n?: number }).n ?? 0) }),
  init: async () => ({ messages: [{ role: 'user', content: 'Say done.' }] }),
  tools: () => [],
  evaluate: async ({ instance }) => ({ reward: 1, details: { correct: 1 }, report: { log: `${instance.n}:`.padEnd(BULKY_REPORT_BYTES, 'x') } }),
};

/** A logger at `level` whose JSON lines a test reads back (`lines`), for asserting what the server logged. */
export function capturedLogger(level: string): { logger: Logger; lines: string[] } {
  const lines: string[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(...chunk.toString().split('\n').filter(Boolean));
      done();
    },
  });
  return { logger: createLogger({ level, destination }), lines };
}
