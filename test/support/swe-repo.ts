import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll } from 'vitest';
import { SWE_BASE_PACKAGES } from '../../src/environments/swe/pypi-tasks/build-task-image.js';
import { silentLogger } from '../../src/observability/logger.js';
import { buildImage } from '../../src/sandboxes/images/build-image.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { Sandbox, SandboxLimits } from '../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../sandboxes/helpers.js';

/** A small repository bound read-only at /testbed of bubblewrap sandboxes of the SWE base image (see {@link sweRepo}). */
export interface SweRepo {
  /** The SWE base image (.sif), once the block's beforeAll ran. */
  readonly image: string;
  /** The repository on the host. */
  readonly repo: string;
  /** A sandbox of the image with the repository at /testbed (1 GiB unless `limits` says otherwise), stopped after the test. */
  start(limits?: Partial<SandboxLimits>): Promise<Sandbox>;
}

/**
 * Registers, in the describe block that calls it, the set-up of SWE eval tests on a small repository: the SWE base
 * image built (or found cached), `files` written to a fresh host directory (named with `prefix`) readable by the
 * sandbox's user, sandboxes stopped after each test, the directory and the driver gone after the block.
 */
export function sweRepo(prefix: string, files: Readonly<Record<string, string>>): SweRepo {
  let image = '';
  let root = '';
  let repo = '';
  const driver = closeAfterAll(new BubblewrapDriver({ logger: silentLogger() }));
  const sandboxes: Sandbox[] = [];
  beforeAll(async () => {
    image = (await buildImage({ packages: SWE_BASE_PACKAGES })).path;
    root = mkdtempSync(join(tmpdir(), prefix));
    chmodSync(root, 0o755);
    repo = join(root, 'testbed');
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(join(repo, path, '..'), { recursive: true });
      writeFileSync(join(repo, path), text);
    }
    execFileSync('chmod', ['-R', 'a+rX', root]);
  }, 300_000);
  afterEach(async () => {
    await Promise.all(sandboxes.splice(0).map((s) => s.stop()));
  });
  afterAll(() => {
    if (root) rmSync(root, { recursive: true, force: true });
  });
  return {
    get image() {
      return image;
    },
    get repo() {
      return repo;
    },
    async start(limits = {}) {
      const sandbox = await driver.start({ ...testSpec({ image, memoryMb: 1024, ...limits }), mounts: [{ source: repo, target: '/testbed', readOnly: true }] });
      sandboxes.push(sandbox);
      return sandbox;
    },
  };
}
