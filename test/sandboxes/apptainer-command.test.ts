import { describe, expect, it } from 'vitest';
import {
  apptainerHostEnv, bindSpec, execArgs, instanceListArgs, instanceStartArgs, instanceStopArgs, killTaggedArgs, overlayCreateArgs, wrapperScript, type InstanceStartSpec,
} from '../../src/sandboxes/apptainer-command.js';

// Golden command lines, checked against the Apptainer 1.3/1.4 CLI (cmd/internal/cli/action_flags.go,
// instance_stop_linux.go) and the user guide (bind paths, networking, cgroups, environment pages).
const base: InstanceStartSpec = {
  image: '/images/python.sif',
  name: 'rollout-apt-4242-0123456789abcdef',
  network: false,
  workspace: { hostWorkdir: '/tmp/rollout-apt-4242-AbC123/work' },
  workdir: '/work',
  mounts: [],
  cgroupLimits: true,
  limits: { memoryMb: 1024, maxProcesses: 64 },
};

describe('apptainer instance start command line', () => {
  it('contains everything, has no network, and sets cgroup limits in bytes by default', () => {
    expect(instanceStartArgs(base)).toEqual([
      '--silent', 'instance', 'start', '--containall', '--no-mount', 'home,cwd,tmp', '--writable-tmpfs', '--no-privs',
      '--net', '--network', 'none',
      '--memory', '1073741824', '--pids-limit', '64',
      '--bind', '/tmp/rollout-apt-4242-AbC123/work:/work:rw',
      '/images/python.sif', 'rollout-apt-4242-0123456789abcdef',
    ]);
  });

  it('makes the overlay image the writable layer (no --writable-tmpfs, no workspace bind) when the workspace lives in it', () => {
    const args = instanceStartArgs({ ...base, workspace: { overlay: '/tmp/rollout-apt-4242-AbC123/overlay.img' }, mounts: [{ source: '/data/repo', target: '/work/repo' }] });
    expect(args).toEqual([
      '--silent', 'instance', 'start', '--containall', '--no-mount', 'home,cwd,tmp', '--overlay', '/tmp/rollout-apt-4242-AbC123/overlay.img', '--no-privs',
      '--net', '--network', 'none',
      '--memory', '1073741824', '--pids-limit', '64',
      '--bind', '/data/repo:/work/repo:ro',
      '/images/python.sif', 'rollout-apt-4242-0123456789abcdef',
    ]);
    expect(() => instanceStartArgs({ ...base, workspace: { overlay: '/tmp/a:b/overlay.img' } })).toThrow(/':'/);
    expect(() => instanceStartArgs({ ...base, workspace: { overlay: 'overlay.img' } })).toThrow(/absolute/);
  });

  it('creates a sparse overlay image of the disk quota with the workspace and nested mount targets made in it', () => {
    expect(overlayCreateArgs({ path: '/tmp/d/overlay.img', sizeMb: 512, dirs: ['/work', '/work/repo'] })).toEqual([
      '--silent', 'overlay', 'create', '--size', '512', '--sparse', '--create-dir', '/work', '--create-dir', '/work/repo', '/tmp/d/overlay.img',
    ]);
    expect(() => overlayCreateArgs({ path: '/tmp/d/o.img', sizeMb: 0, dirs: [] })).toThrow(/positive/);
    expect(() => overlayCreateArgs({ path: '/tmp/d/o.img', sizeMb: 1, dirs: ['/a,b'] })).toThrow(/','/);
    expect(() => overlayCreateArgs({ path: 'o.img', sizeMb: 1, dirs: [] })).toThrow(/absolute/);
  });

  it('shares the host network only when the spec asks', () => {
    const args = instanceStartArgs({ ...base, network: true });
    expect(args).not.toContain('--net');
    expect(args).not.toContain('--network');
  });

  it('binds mounts read-only unless they say rw, after the workspace', () => {
    const args = instanceStartArgs({
      ...base,
      image: '/images/rootfs',
      mounts: [{ source: '/data/repo', target: '/repo' }, { source: '/scratch/out', target: '/work/out', readOnly: false }],
    });
    expect(args.slice(-8)).toEqual([
      '--bind', '/tmp/rollout-apt-4242-AbC123/work:/work:rw',
      '--bind', '/data/repo:/repo:ro',
      '--bind', '/scratch/out:/work/out:rw',
      '/images/rootfs', 'rollout-apt-4242-0123456789abcdef',
    ]);
  });

  it('leaves memory and process limits to the exec wrapper in the rlimit fallback', () => {
    const args = instanceStartArgs({ ...base, cgroupLimits: false });
    expect(args).not.toContain('--memory');
    expect(args).not.toContain('--pids-limit');
  });

  it('refuses bind paths --bind cannot express (comma, colon) and relative ones', () => {
    expect(() => bindSpec('/a,b', '/x', true)).toThrow(/','/);
    expect(() => bindSpec('/a', '/x:y', true)).toThrow(/':'/);
    expect(() => bindSpec('rel', '/x', true)).toThrow(/absolute/);
    expect(() => instanceStartArgs({ ...base, mounts: [{ source: '/a:b', target: '/b' }] })).toThrow();
  });
});

describe('apptainer exec command line', () => {
  it('execs into the instance with a clean environment through the sh wrapper, values as positional words', () => {
    const args = execArgs({
      name: 'rollout-apt-1-00', workdir: '/work', cwd: '/work/sub', env: { HOME: '/work', A: 'x,y $HOME "z"' },
      tag: 'abcd', rlimits: { maxFileMb: 256 }, argv: ['python3', '-c', 'print(1)'],
    });
    expect(args).toEqual([
      '--silent', 'exec', '--cleanenv', '--pwd', '/work', 'instance://rollout-apt-1-00',
      '/bin/sh', '-c', wrapperScript({ maxFileMb: 256 }), 'rollout-exec', '/work/sub',
      'HOME=/work', 'A=x,y $HOME "z"', 'ROLLOUT_EXEC=abcd',
      'python3', '-c', 'print(1)',
    ]);
  });

  it('refuses an argv[0] that env would read as an assignment', () => {
    expect(() => execArgs({ name: 'n', workdir: '/w', cwd: '/w', env: {}, tag: 't', rlimits: { maxFileMb: 1 }, argv: ['A=b'] })).toThrow(/=/);
  });

  it('wrapper: cd or a marked exit 125, RLIMIT_FSIZE in 512-byte blocks, env -i; prlimit only in the fallback', () => {
    expect(wrapperScript({ maxFileMb: 256 })).toBe(
      [`cd -- "$1" 2>/dev/null || { printf '%s%s\\n' 'rollout: no such directory: ' "$1" >&2; exit 125; }`, 'shift', 'ulimit -f 524288', 'exec env -i "$@"'].join('\n'),
    );
    expect(wrapperScript({ maxFileMb: 1, memoryMb: 512, maxProcesses: 32 }).split('\n').at(-1)).toBe('exec prlimit --as=536870912 --nproc=32 -- env -i "$@"');
  });

  it('kills tagged processes inside the instance, and only accepts plain tags', () => {
    const args = killTaggedArgs('inst', 'ab12');
    expect(args.slice(0, 8)).toEqual(['--silent', 'exec', '--cleanenv', '--pwd', '/', 'instance://inst', '/bin/sh', '-c']);
    expect(args[8]).toContain("grep -qx 'ROLLOUT_EXEC=ab12'");
    expect(() => killTaggedArgs('inst', "x'; rm -rf /")).toThrow();
  });
});

describe('apptainer instance stop and list command lines', () => {
  it('stops with a grace period (SIGINT, then SIGKILL) or forcibly', () => {
    expect(instanceStopArgs('n', { timeoutS: 2 })).toEqual(['--silent', 'instance', 'stop', '--timeout', '2', 'n']);
    expect(instanceStopArgs('n', { force: true })).toEqual(['--silent', 'instance', 'stop', '--force', 'n']);
  });

  it('lists as JSON', () => {
    expect(instanceListArgs()).toEqual(['--silent', 'instance', 'list', '--json']);
  });
});

describe("apptainer binary's own environment", () => {
  it('keeps identity, PATH and the systemd session, and drops APPTAINER_*/SINGULARITY_* and everything else', () => {
    const env = apptainerHostEnv({
      PATH: '/usr/bin', HOME: '/root', USER: 'u', XDG_RUNTIME_DIR: '/run/user/1', DBUS_SESSION_BUS_ADDRESS: 'unix:path=/x',
      APPTAINER_BINDPATH: '/secret', SINGULARITY_BIND: '/secret', AWS_SECRET_ACCESS_KEY: 'k',
    });
    expect(env).toEqual({ PATH: '/usr/bin', LANG: 'C.UTF-8', HOME: '/root', USER: 'u', XDG_RUNTIME_DIR: '/run/user/1', DBUS_SESSION_BUS_ADDRESS: 'unix:path=/x' });
  });
});
