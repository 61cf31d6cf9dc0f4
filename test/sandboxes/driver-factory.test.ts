import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config.js';
import { silentLogger } from '../../src/observability/logger.js';
import { createSandboxDriver } from '../../src/sandboxes/driver-factory.js';
import { makeApptainerDouble } from './apptainer-double.js';
import { testSpec } from './helpers.js';

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

  it("passes sandbox.apptainerDisk to the driver: 'overlay' refuses to run without the quota", async () => {
    const double = makeApptainerDouble({ refuseOverlay: 'create' });
    try {
      const config = parseConfig({ sandbox: { driver: 'apptainer', apptainerPath: double.binary, apptainerDisk: 'overlay' } }).sandbox;
      await expect(createSandboxDriver(config, silentLogger()).start(testSpec({ image: '/' }))).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringMatching(/overlay create failed.*disk option is 'overlay'/s) });
      expect(() => parseConfig({ sandbox: { apptainerDisk: 'quota' } })).toThrow(expect.objectContaining({ code: 'invalid_argument', field: 'sandbox.apptainerDisk' }));
    } finally {
      await double.cleanup();
    }
  });

  it('rejects an unknown driver name with its path', () => {
    expect(() => parseConfig({ sandbox: { driver: 'docker' } })).toThrow(expect.objectContaining({ code: 'invalid_argument', field: 'sandbox.driver' }));
  });
});
