import { RolloutError } from '../errors.js';
import type { SandboxRequest } from '../sandboxes/spec.js';
import type { Sandbox } from '../sandboxes/types.js';
import type { OpenSandbox } from './types.js';

/**
 * A fresh sandbox to grade in, from `openSandbox` of the evaluation context: it starts from the image, so nothing
 * the episode did in the sample's own sandbox — processes left running, files planted in /tmp or the workspace,
 * memory or processes used up to the limits — can change or break the grading; only what the environment copies
 * in is there. The pipeline stops it when `evaluate` settles (and on every other path); a start failure is
 * SANDBOX_ERROR. `request` defaults to the environment's `sandbox(instance)`.
 *
 * Throws environment_error when there is no `openSandbox` (evaluate called outside the pipeline, e.g. by a test
 * that passes none): grading in the episode's sandbox instead would silently give up that guarantee.
 */
export function openGradingSandbox(openSandbox: OpenSandbox | undefined, environment: string, request?: SandboxRequest): Promise<Sandbox> {
  if (!openSandbox) {
    return Promise.reject(new RolloutError('environment_error', `the ${environment} environment grades in a fresh sandbox and needs openSandbox in its evaluation context`));
  }
  return openSandbox(request);
}
