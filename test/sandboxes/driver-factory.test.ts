import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config.js';
import { silentLogger } from '../../src/observability/logger.js';
import { createSandboxDriver } from '../../src/sandboxes/driver-factory.js';

describe('sandbox driver from config', () => {
  it('is bubblewrap by default', () => {
    expect(createSandboxDriver(parseConfig({}).sandbox, silentLogger()).name).toBe('bwrap');
  });

  it('is apptainer when configured, with the configured binary', async () => {
    const config = parseConfig({ sandbox: { driver: 'apptainer', apptainerPath: '/nonexistent/singularity' } }).sandbox;
    const driver = createSandboxDriver(config, silentLogger());
    expect(driver.name).toBe('apptainer');
    await expect(driver.reap?.()).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringContaining('/nonexistent/singularity') });
  });

  it('rejects an unknown driver name with its path', () => {
    expect(() => parseConfig({ sandbox: { driver: 'docker' } })).toThrow(expect.objectContaining({ code: 'invalid_argument', field: 'sandbox.driver' }));
  });
});
