import { status, type ServiceError } from '@grpc/grpc-js';
import { mkdir, mkdtemp, realpath, rm, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import type { TaskInput } from '../../src/client/rollout-client.js';
import { RolloutError } from '../../src/errors.js';
import type { Sandbox, SandboxDriver, SandboxSpec } from '../../src/sandboxes/types.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

/** A driver double: records the spec of each sandbox it is asked for and starts none (SANDBOX_ERROR). */
class RecordingDriver implements SandboxDriver {
  readonly name = 'recording';
  readonly specs: SandboxSpec[] = [];

  async start(spec: SandboxSpec): Promise<Sandbox> {
    this.specs.push(spec);
    throw new RolloutError('sandbox_error', 'recording driver double: starts nothing');
  }
}

function sweTask(taskId: string, image: string): TaskInput {
  return {
    taskId,
    environment: 'swe',
    numSamples: 1,
    instance: { image, problem_statement: 'add() subtracts', FAIL_TO_PASS: ['tests/test_calc.py::test_add'] },
  };
}

// Regression: a SWE task could name any path on the server as its image: "/" or "host" ran the model's sandbox over
// the host's own files, so a trainer token was enough to read server configs and tokens into trajectories.
describe('a SWE task naming an image outside sandbox.imageDirs is refused at submit', () => {
  let h: ServerHarness;
  let root: string;
  let allowed: string;
  const driver = new RecordingDriver();

  beforeAll(async () => {
    root = await realpath(await mkdtemp(join(tmpdir(), 'rollout-swe-image-dirs-')));
    allowed = join(root, 'images');
    await mkdir(join(allowed, 'task-rootfs'), { recursive: true });
    await mkdir(join(root, 'secrets'));
    await symlink('/etc', join(allowed, 'etc-link'));
    h = await startServerHarness({ sandboxes: driver, config: { sandbox: { imageDirs: [allowed] } } });
  });
  afterAll(async () => {
    await h?.close();
    await rm(root, { recursive: true, force: true });
  });

  it('with INVALID_ARGUMENT naming instance.image and the allowed dirs: "/", "host", a symlink out, "../" escapes', async () => {
    const images = ['/', 'host', '/root', join(allowed, 'etc-link'), join(allowed, '..', 'secrets'), `${allowed}/task-rootfs/../../../..`];
    for (const [i, image] of images.entries()) {
      const err = (await h.client.submit(sweTask(`refused-${i}`, image)).catch((e: unknown) => e)) as ServiceError;
      expect(err.code, image).toBe(status.INVALID_ARGUMENT);
      expect(err.metadata.get('rollout-field'), image).toEqual(['task.instance.image']);
      expect(err.details, image).toContain('sandbox.imageDirs');
      // "host" is no path: the swe instance itself refuses it, without the server's config to quote.
      if (image !== 'host') expect(err.details, image).toContain(allowed);
    }
    expect(driver.specs).toEqual([]);
  });

  // Found by review (helper-44): a missing path was let through at submit (then ENVIRONMENT_ERROR "image X does not exist
  // on this server") while an existing one was refused, so a trainer could probe which paths exist on the server.
  it('refuses every path outside the allowed dirs with one message, whether it exists or not', async () => {
    const images = ['/etc/passwd', '/nonexistent/task.sif', join(root, 'secrets'), join(root, 'secrets', 'missing.sif'), '/proc/1/root/x.sif'];
    const answers: string[] = [];
    for (const [i, image] of images.entries()) {
      const err = (await h.client.submit(sweTask(`probe-${i}`, image)).catch((e: unknown) => e)) as ServiceError;
      expect(err.code, image).toBe(status.INVALID_ARGUMENT);
      expect(err.metadata.get('rollout-field'), image).toEqual(['task.instance.image']);
      answers.push(err.details.replace(image, '<image>'));
    }
    expect(new Set(answers).size, answers.join('\n')).toBe(1);
    expect(driver.specs).toEqual([]);
  });

  // A typo in a dataset's image is bad input, refused at submit naming the field (was a SANDBOX_ERROR at init, which a
  // dataset runner retries as infrastructure); inside the dirs the answer reveals nothing the operator did not list.
  it('refuses an image inside an allowed dir that does not exist, naming instance.image', async () => {
    const image = join(allowed, 'no-such-task.sif');
    const err = (await h.client.submit(sweTask('missing-inside', image)).catch((e: unknown) => e)) as ServiceError;
    expect(err.code).toBe(status.INVALID_ARGUMENT);
    expect(err.metadata.get('rollout-field')).toEqual(['task.instance.image']);
    expect(err.details).toContain(`the image ${image} does not exist on this server`);
    expect(driver.specs).toEqual([]);
  });

  it('accepts an image inside an allowed dir and starts its sandbox on it', async () => {
    const image = join(allowed, 'task-rootfs');
    await h.client.submit(sweTask('allowed', image));
    const [t] = (await h.client.getTrajectory('allowed', { wait: true })).trajectories;
    expect(t!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_SANDBOX_ERROR); // the driver double's doing, past the check
    expect(driver.specs.map((s) => s.image)).toEqual([image]);
  });
});

describe('with sandbox.imageDirs unset', () => {
  it('refuses "/" all the same (only the project cache and the configured image dir are allowed)', async () => {
    const h = await startServerHarness({ sandboxes: new RecordingDriver() });
    try {
      const err = (await h.client.submit(sweTask('root', '/')).catch((e: unknown) => e)) as ServiceError;
      expect(err.code).toBe(status.INVALID_ARGUMENT);
      expect(err.metadata.get('rollout-field')).toEqual(['task.instance.image']);
      expect(err.details).toContain('.cache/images');
    } finally {
      await h.close();
    }
  });
});
