import { realpath, stat } from 'node:fs/promises';
import { RolloutError, throwIfAborted } from '../../errors.js';

/** An image's root file system, visible on the host (read-only) while held. */
export interface MountedImage {
  /** Host directory holding the image's root file system. */
  readonly root: string;
  /** Gives the image back; the last holder of a mounted image unmounts it. Idempotent. */
  release(): Promise<void>;
}

/**
 * Makes sandbox images available as host directories that a driver binds as the sandbox's root. A directory
 * image is used in place. A Singularity image (.sif) is mounted read-only (its squashfs partition, through
 * squashfuse) once per image and shared by every sandbox that holds it.
 *
 * This is the seam the drivers use; `.sif` support lives in sif-mount.ts (`SifImageMounts`, which also handles
 * directories).
 */
export interface ImageMounts {
  acquire(image: string, signal?: AbortSignal): Promise<MountedImage>;
  /** Unmounts and removes what a crashed predecessor left under this manager's mount root. */
  reap(): Promise<{ removed: number }>;
  /** Unmounts every image now, held or not (server shutdown); optional: implementations without mounts omit it. */
  close?(): Promise<void>;
}

/** Directory images only: `.sif` files are refused with a sandbox_error saying so. */
export class DirectoryImages implements ImageMounts {
  async acquire(image: string, signal?: AbortSignal): Promise<MountedImage> {
    throwIfAborted(signal);
    if (image.endsWith('.sif')) throw new RolloutError('sandbox_error', `cannot run ${image}: no .sif support configured`);
    const st = await stat(image).catch(() => undefined);
    if (!st?.isDirectory()) throw new RolloutError('sandbox_error', `image ${image} is not a directory`);
    const root = await realpath(image);
    return { root, release: async () => undefined };
  }

  async reap(): Promise<{ removed: number }> {
    return { removed: 0 };
  }
}
