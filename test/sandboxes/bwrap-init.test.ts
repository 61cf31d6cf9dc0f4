import { describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { buildHolderArgv, hostLayout } from '../../src/sandboxes/bwrap-command.js';
import { SANDBOX_INIT_PATH } from '../../src/sandboxes/init/sandbox-init.js';
import { callTool, closeAfterAll, sandboxesStoppedAfterEach, testSpec } from './helpers.js';

// Regression: the sandbox's pid 1 was bwrap's init, which exits with its first child, a holder shell at pid 2 of the
// same uid as the model's commands: one `kill -9 -1` in a tool call ended the sandbox, and the trajectory ended
// SANDBOX_ERROR (infrastructure) for what the policy did. The sandbox init (src/sandboxes/init/sandbox-init.c) is now
// pid 1 and the holder: out of reach of the sandbox's signals, reaping orphans, not ptrace-able.

const drivers = { setuid: closeAfterAll(new BubblewrapDriver()), userns: closeAfterAll(new BubblewrapDriver({ identity: 'userns' })) };
const start = sandboxesStoppedAfterEach<BubblewrapSandbox>();
const call = callTool;

/** The sandbox's processes as `pid state command` lines, read inside it. */
async function processes(sandbox: BubblewrapSandbox): Promise<string[]> {
  const code = [
    'import os',
    'for p in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):',
    '    try:',
    '        stat = open(f"/proc/{p}/stat").read(); cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0")[0].decode()',
    '    except OSError: continue',
    '    if p != os.getpid(): print(p, stat[stat.rindex(")") + 2], cmd)',
  ].join('\n');
  return (await sandbox.exec(['python3', '-c', code])).stdout.trim().split('\n').filter(Boolean);
}

const isRoot = process.getuid?.() === 0;
describe.each(isRoot ? (['setuid', 'userns'] as const) : (['userns'] as const))('the sandbox init (%s identity)', (identity) => {
  const driver = drivers[identity];

  it('is pid 1 and the only process of an idle sandbox; capabilities say so', async () => {
    const sandbox = await start(driver);
    expect(driver.capabilities.holderIsInit).toBe(true);
    expect(await processes(sandbox)).toEqual([`1 S ${SANDBOX_INIT_PATH}`]);
  });

  it('survives `kill -9 -1` from a command: the next commands run and the workspace is intact', async () => {
    const sandbox = await start(driver);
    expect((await sandbox.exec(['sh', '-c', 'echo kept > /work/f; sleep 100 & sleep 100 & kill -9 -1; echo after $?'])).stdout).toBe('after 0\n');
    expect((await sandbox.exec(['cat', '/work/f'])).stdout).toBe('kept\n');
    expect(await processes(sandbox)).toEqual([`1 S ${SANDBOX_INIT_PATH}`]);
  });

  it("survives the model's persistent shell killing everything: the tool call is the model's outcome, the next call runs", async () => {
    const sandbox = await start(driver);
    await call('bash', { command: 'echo kept > /work/f; (sleep 300 &); python3 -c "import time; time.sleep(300)" &' }, sandbox);
    const [killed] = await call('bash', { command: 'kill -9 -1' }, sandbox);
    expect(killed!.toolName).toBe('bash');
    expect(await call('python', { code: 'print(open("/work/f").read().strip())' }, sandbox)).toMatchObject([{ outcome: 'ok', output: 'kept' }]);
    expect((await call('bash', { command: 'echo still here' }, sandbox))[0]!.output).toContain('still here');
  }, 60_000);

  it('survives a fork bomb at pids.max followed by `kill -9 -1`', async () => {
    const sandbox = await start(driver, { maxProcesses: 16 });
    const bomb = "setsid sh -c 'while :; do sleep 1000 & done' </dev/null >/dev/null 2>&1 & sleep 1; kill -9 -1; echo after";
    expect((await sandbox.exec(['sh', '-c', bomb])).stdout).toContain('after');
    expect((await sandbox.exec(['echo', 'ok'])).stdout).toBe('ok\n');
  }, 60_000);

  it('reaps orphans: hundreds of exited double-forked children leave no zombies to fill pids.max', async () => {
    const sandbox = await start(driver, { maxProcesses: 16 });
    // Each `(true &)` leaves an orphan that exits at once; unreaped, 16 of them would use up pids.max.
    for (let round = 0; round < 5; round++) {
      const r = await sandbox.exec(['sh', '-c', 'for i in $(seq 60); do (true &); done; echo done']);
      expect(r).toMatchObject({ exitCode: 0, stdout: 'done\n' });
    }
    const zombies = (await processes(sandbox)).filter((line) => line.split(' ')[1] === 'Z');
    expect(zombies).toEqual([]);
  }, 60_000);

  it("cannot be ptraced or have its descriptors opened by the sandbox's processes (same uid)", async () => {
    const sandbox = await start(driver);
    const code = [
      'import ctypes, os',
      'try: open("/proc/1/fd/0", "wb"); print("opened")',
      'except OSError as e: print("denied", e.errno)',
      'libc = ctypes.CDLL(None, use_errno=True)',
      'print("ptrace", libc.ptrace(16, 1, None, None), ctypes.get_errno())', // PTRACE_ATTACH
    ].join('\n');
    const r = await sandbox.exec(['python3', '-c', code]);
    expect(r.stdout).toMatch(/^denied \d+\nptrace -1 1\n$/); // EPERM
    expect((await sandbox.exec(['echo', 'ok'])).stdout).toBe('ok\n');
  });
});

describe('without the init binary', () => {
  const fallback = closeAfterAll(new BubblewrapDriver({ init: false }));

  it("runs bwrap's init and a holder shell, and says so in its capabilities", async () => {
    const sandbox = await start(fallback);
    expect(fallback.capabilities.holderIsInit).toBe(false);
    expect(await processes(sandbox)).toEqual(['1 S bwrap', '2 S /bin/sh']);
    expect((await sandbox.exec(['echo', 'ok'])).stdout).toBe('ok\n');
  });

  it('a missing binary is the same fallback, not a failure', async () => {
    const missing = closeAfterAll(new BubblewrapDriver({ init: '/nonexistent/rollout-sandbox-init' }));
    const sandbox = await start(missing);
    expect(missing.capabilities.holderIsInit).toBe(false);
    expect((await sandbox.exec(['echo', 'ok'])).stdout).toBe('ok\n');
  });
});

describe('the holder command line', () => {
  const base = {
    bwrapPath: 'bwrap', limits: testSpec().limits, network: false, layout: hostLayout(), workdir: '/work', cgroupProcs: [],
    stageDir: '/run/stage', infoFd: 4,
  };

  it('binds the init read-only and runs it as pid 1; staged like any bind for a setuid identity', () => {
    const userns = buildHolderArgv({ ...base, identity: { kind: 'userns' }, mounts: [], init: '/opt/init' });
    expect(userns).toContain('--as-pid-1');
    expect(userns.join(' ')).toContain(`--ro-bind /opt/init ${SANDBOX_INIT_PATH} `);
    expect(userns.slice(-2)).toEqual(['--', SANDBOX_INIT_PATH]);
    const mounts = [{ source: '/data', dest: '/data', readOnly: true }];
    const setuid = buildHolderArgv({ ...base, identity: { kind: 'setuid', uid: 7, gid: 7 }, mounts, init: '/opt/init' });
    // Staging order: the layout's binds, spec.mounts, then the init.
    const sources = setuid.slice(setuid.indexOf('/data'), setuid.indexOf('--', setuid.indexOf('/data')));
    expect(sources).toEqual(['/data', '/opt/init']);
    expect(setuid.join(' ')).toContain(`--ro-bind /run/stage/1 ${SANDBOX_INIT_PATH} `);
  });

  it('without an init: no --as-pid-1, the holder shell', () => {
    const argv = buildHolderArgv({ ...base, identity: { kind: 'userns' }, mounts: [] });
    expect(argv).not.toContain('--as-pid-1');
    expect(argv.slice(-4, -1)).toEqual(['--', '/bin/sh', '-c']);
  });
});
