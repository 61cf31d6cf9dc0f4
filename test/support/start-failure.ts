import { expect } from 'vitest';
import { startRolloutServer } from '../../src/app.js';
import type { ServerConfigInput } from '../../src/config.js';
import { RolloutError } from '../../src/errors.js';
import { silentLogger } from '../../src/observability/logger.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';

/** What startRolloutServer fails with (a server that started is shut down and reported as a failure of the test). */
export async function startFailure(config: ServerConfigInput): Promise<RolloutError> {
  const outcome = await startRolloutServer({ port: 0, tokenWorkers: { count: 0 }, ...config }, { logger: silentLogger(), sandboxes: new NullSandboxDriver() }).then(
    async (s) => {
      await s.shutdown();
      return new Error('the server started');
    },
    (e: unknown) => e,
  );
  expect(outcome).toBeInstanceOf(RolloutError);
  return outcome as RolloutError;
}
