import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import type { Socket } from 'node:net';
import { z } from 'zod';
import { RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import { APPTAINER_PREFIX, instanceStopArgs } from './apptainer-command.js';
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

/**
 * The watchdog's script (POSIX sh): reads `+NAME` (an instance starting), `-NAME` (stopped) and `done` (the driver
 * closed: nothing to do) lines on stdin. At end of input without `done` — the server died, however: the kernel closes
 * its end of the pipe even on SIGKILL — it stops every instance still listed (`$stop... NAME`, SIGKILL) and removes
 * the server's host dirs (`<prefix>` + mkdtemp's 6 characters). Arguments: the host-dir prefix, then the stop argv.
 */
const WATCHDOG_SCRIPT = `
prefix=$1; shift
live=' '
while IFS= read -r line; do
  case $line in
    done) exit 0 ;;
    +*) live="$live\${line#+} " ;;
    -*)
      name=\${line#-}
      case $live in *" $name "*) live=\${live%%" $name "*}' '\${live#*" $name "} ;; esac ;;
  esac
done
for name in $live; do "$@" "$name" </dev/null >/dev/null 2>&1; done
for dir in "$prefix"??????; do
  [ -d "$dir" ] || continue
  chmod -R u+rwX "$dir" 2>/dev/null
  rm -rf "$dir"
done
`;

/**
 * Ties this server's Apptainer instances to its life. An instance is not the server's child: `apptainer instance
 * start` daemonizes it (its starter leaves the server's process tree and session), so nothing the kernel does when
 * the server dies reaches it — no parent-death signal (the starter, not us, would have to ask for one, and apptainer
 * does not), no process group or session, no PID namespace the server could hold without root. Before this, an
 * instance outlived a server killed hard (a third signal, SIGKILL, the OOM killer) until the next start's `reap()`.
 *
 * So a watchdog: a `sh` started on first use in a session of its own (Ctrl-C and a hang-up reach the server's
 * process group, not it), reading a pipe only the server writes. The server tells it each instance as it starts and
 * stops; the kernel closes the pipe when the server dies, however it dies, and the watchdog then stops what is still
 * listed and removes the server's host dirs; a clean close says `done`, and it exits without a call. The limit: an
 * `instance start` still in flight when the server dies can bring its instance up after the watchdog ran (the start is
 * not killed with the server); `reap()` at the next start stops it, as before. A watchdog killed with the server (a
 * cgroup-wide kill: systemd's KillMode=control-group, a Slurm job's end) does nothing, and needs to do nothing when the
 * same kill took the instances (not so for instances apptainer moved to a systemd scope of their own: the next
 * `reap()`, again).
 */
export class InstanceWatchdog {
  private child: ChildProcess | undefined;
  private failed = false;

  constructor(private readonly options: { binary: string; env: Record<string, string>; hostDirPrefix: string; logger: Logger }) {}

  /** Instance `name` is starting: if the server dies before `untrack(name)`, the watchdog stops it. */
  track(name: string): void {
    this.send(`+${name}\n`);
  }

  /** Instance `name` was stopped. */
  untrack(name: string): void {
    if (this.child !== undefined) this.send(`-${name}\n`);
  }

  /** The driver is done (every instance stopped): the watchdog exits without stopping anything. */
  close(): void {
    const child = this.child;
    if (child === undefined) return;
    this.child = undefined;
    child.stdin?.end('done\n');
  }

  private send(line: string): void {
    if (this.failed) return;
    if (this.child === undefined) {
      const child = spawn('/bin/sh', ['-c', WATCHDOG_SCRIPT, 'rollout-apt-watchdog', this.options.hostDirPrefix, this.options.binary, ...instanceStopArgs('', { force: true }).slice(0, -1)], {
        detached: true,
        stdio: ['pipe', 'ignore', 'ignore'],
        env: this.options.env,
      });
      // Neither the watchdog nor its pipe keeps the server's event loop alive.
      child.unref();
      (child.stdin as Socket | null)?.unref();
      const fail = (err: Error): void => {
        if (this.failed) return;
        this.failed = true;
        this.options.logger.warn({ err }, 'the apptainer instance watchdog is gone: instances a server killed hard leaves run until the next start reaps them');
      };
      child.once('error', fail);
      child.stdin?.on('error', fail);
      child.once('exit', (code, signal) => {
        if (this.child === child) fail(new Error(`exited (${code ?? signal})`));
      });
      this.child = child;
    }
    this.child.stdin?.write(line);
  }
}
