import type { ServerConfig } from '../config.js';
import type { Logger } from '../observability/logger.js';
import { ApptainerDriver } from './apptainer.js';
import { BubblewrapDriver } from './bwrap.js';
import type { SandboxDriver } from './types.js';

/**
 * The sandbox driver the config names (`sandbox.driver`): bubblewrap (rootless, the default) or
 * Apptainer/Singularity (`sandbox.apptainerPath`: `apptainer`, `singularity` or a path; `sandbox.apptainerDisk`: how
 * diskMb holds there); `sandbox.networkMode` says what bubblewrap gives `network: true`. Constructing a driver
 * checks nothing on the host; a driver that cannot work here fails its first `start` (or `reap`) with a
 * sandbox_error that says why.
 */
export function createSandboxDriver(config: ServerConfig['sandbox'], logger: Logger): SandboxDriver {
  switch (config.driver) {
    case 'bwrap':
      return new BubblewrapDriver({ logger, network: config.networkMode, networkAllow: config.networkAllow });
    case 'apptainer':
      return new ApptainerDriver({ logger, binary: config.apptainerPath, disk: config.apptainerDisk });
  }
}
