import { randomBytes } from 'node:crypto';
import { z } from 'zod';
import { RolloutError } from '../errors.js';
import { APPTAINER_PREFIX } from './apptainer-command.js';
import { isProcessAlive } from './images/process-identity.js';

/** One running instance as `apptainer instance list --json` reports it. */
export interface InstanceInfo {
  name: string;
  /** Host PID of the instance's process (its PID-namespace init). */
  pid: number;
  image: string;
}

/**
 * The documented JSON of `instance list --json` (Apptainer 1.x internal/app/apptainer/instance_linux.go, the same
 * in SingularityCE 3.x/4.x): `{"instances": [{"instance", "pid", "img", "ip", "logErrPath", "logOutPath"}]}`,
 * tab-indented. Only the three fields we use are required; the log paths are missing in older Singularity.
 */
const listSchema = z.object({
  instances: z
    .array(z.object({ instance: z.string(), pid: z.number().int(), img: z.string() }))
    .nullable()
    .transform((v) => v ?? []),
});

/**
 * Parses `instance list --json` output. An empty output reads as no instances (a build that prints nothing when
 * there are none); anything else that does not match the format is a sandbox_error quoting it, never a guess.
 */
export function parseInstanceList(stdout: string): InstanceInfo[] {
  const text = stdout.trim();
  if (text === '') return [];
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new RolloutError('sandbox_error', `apptainer instance list --json printed no JSON: ${text.slice(0, 200)}`, { cause: err });
  }
  const parsed = listSchema.safeParse(json);
  if (!parsed.success) throw new RolloutError('sandbox_error', `apptainer instance list --json: unexpected format: ${text.slice(0, 200)}`);
  return parsed.data.instances.map((i) => ({ name: i.instance, pid: i.pid, image: i.img }));
}

/**
 * A fresh instance name: `rollout-apt-<server pid>-<16 hex>`. The server's PID is what lets `reap()` prove an
 * instance is a leftover of a dead server (and never stop one of a live server sharing this user).
 */
export function newInstanceName(ownerPid: number = process.pid): string {
  return `${APPTAINER_PREFIX}-${ownerPid}-${randomBytes(8).toString('hex')}`;
}

const NAME = new RegExp(`^${APPTAINER_PREFIX}-(\\d+)-[0-9a-f]{16}$`);
/** Host dirs are `rollout-apt-<pid>-` plus mkdtemp's 6 characters. */
const DIR = new RegExp(`^${APPTAINER_PREFIX}-(\\d+)-[A-Za-z0-9]{6}$`);

/** The PID of the server that created this instance, or undefined when the name is not ours. */
export function ownerOfInstance(name: string): number | undefined {
  const m = NAME.exec(name);
  return m ? Number(m[1]) : undefined;
}

/** The PID of the server that created this host dir (by its base name), or undefined when it is not ours. */
export function ownerOfHostDir(baseName: string): number | undefined {
  const m = DIR.exec(baseName);
  return m ? Number(m[1]) : undefined;
}

/** The instances a dead server of ours left: our prefix, and an owner PID that is neither us nor alive. */
export function orphanedInstances(instances: readonly InstanceInfo[], alive: (pid: number) => boolean = isProcessAlive): InstanceInfo[] {
  return instances.filter((i) => {
    const owner = ownerOfInstance(i.name);
    return owner !== undefined && owner !== process.pid && !alive(owner);
  });
}
