import { listMounts, unmountFuse } from '../../src/sandboxes/images/fuse-mounts.js';

/**
 * vitest global setup: the test run must leave no image mount behind. A SandboxDriver (or SifImageMounts) that is
 * never closed keeps an image mounted for its grace period; when the test file's worker exits meanwhile, the
 * squashfuse daemon and its mount outlive the run (a fresh CI machine was left with one after every run). Mounts
 * that appeared during the run and are still there at its end are unmounted here — by their mount point: each is
 * provably this run's — and the run fails naming them, so the test that leaked is fixed rather than hidden.
 */
export default async function setup(): Promise<() => Promise<void>> {
  const before = new Set((await squashfuseMounts()).map((m) => m.mountPoint));
  return async () => {
    const leaked = (await squashfuseMounts()).filter((m) => !before.has(m.mountPoint));
    if (leaked.length === 0) return;
    const unmounted = await Promise.allSettled(leaked.map((m) => unmountFuse(m.mountPoint)));
    const list = leaked.map((m, i) => `${m.mountPoint} (${m.source}${unmounted[i]!.status === 'rejected' ? ', could not be unmounted' : ''})`).join(', ');
    // vitest reports an error thrown here but still exits 0: the exit code is what fails the run.
    process.exitCode = 1;
    throw new Error(`the test run left ${leaked.length} image mount(s) behind: a driver or SifImageMounts was not closed: ${list}`);
  };
}

async function squashfuseMounts() {
  return (await listMounts()).filter((m) => m.fsType === 'fuse.squashfuse');
}
