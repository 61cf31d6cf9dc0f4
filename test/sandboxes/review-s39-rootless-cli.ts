// Started by review-s39-rootless.test.ts under `setpriv --reuid=UID` as a server stand-in that is NOT root: runs the
// bubblewrap driver's operations (start, exec, files, the persistent shell, per-process limits, both network settings,
// stop) and prints what each gave as one JSON object on stdout. argv: HOST_ADDRESS PORT of a TCP listener of the host
// (the test's) that says `hello` — or `-` `0` when the host has no non-loopback IPv4 address.
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../src/sandboxes/types.js';
import { testSpec } from './helpers.js';

const [hostAddress = '-', port = '0'] = process.argv.slice(2);
const out: Record<string, unknown> = { uid: process.getuid?.() };
const attempt = async (name: string, step: () => Promise<unknown>): Promise<void> => {
  try {
    out[name] = await step();
  } catch (err) {
    out[name] = { error: String(err) };
  }
};

const driver = new BubblewrapDriver({});
out.capabilities = driver.capabilities;
const sandbox = await driver.start(testSpec({ memoryMb: 512, maxFileMb: 16 }));
await attempt('exec', async () => (await sandbox.exec(['sh', '-c', 'id -u; id -g; echo hi'])).stdout);
// The sandbox's processes must not create user namespaces (bwrap --disable-userns): exit status of `unshare -U`.
await attempt('unshareUser', async () => (await sandbox.exec(['unshare', '-U', 'true'])).exitCode);
// Without writable cgroups: RLIMIT_AS (memoryMb), RLIMIT_FSIZE (maxFileMb) and RLIMIT_CORE per process, as bash reports
// them (KiB, 1024-byte blocks, blocks).
await attempt('limits', async () => (await sandbox.exec(['bash', '-c', 'echo $(ulimit -v) $(ulimit -f) $(ulimit -c)'])).stdout.trim());
// Only 0, 1 and 2 reach a command: none of the namespace descriptors (the owning user namespace's included).
// Neither a pipe nor a redirection in the listing shell: it holds a pipeline's pipe (3 and 4) until it has forked both
// sides, which ls listed now and then under load, and dash saves a redirected stdout at 10 while the command runs.
await attempt('fds', async () => (await sandbox.exec(['sh', '-c', 'ls /proc/$$/fd'])).stdout.trim().split('\n').join(' '));
await attempt('write', async () => sandbox.writeFile('notes/a.txt', 'rootless\n').then(() => 'ok'));
await attempt('read', async () => sandbox.readFile('notes/a.txt'));
await attempt('list', async () => (await sandbox.listDir('notes')).map((e) => e.name));
await attempt('owner', async () => (await sandbox.exec(['stat', '-c', '%u', 'notes/a.txt'])).stdout.trim());
await attempt('shell', async () => {
  const shell = sandbox.shell();
  await shell.run('X=41; cd notes');
  const r = await shell.run('echo $((X + 1)) $(pwd) $(cat a.txt)');
  return { exitCode: r.exitCode, output: r.output.trim(), cwd: r.cwd };
});
await attempt('interfaces', async () => (await sandbox.exec(['sh', '-c', "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '"])).stdout.trim());
await sandbox.stop();
await attempt('afterStop', async () => sandbox.exec(['true']));

let networked: Sandbox | undefined;
await attempt('netStart', async () => {
  networked = await driver.start(testSpec({ network: true }));
  return 'ok';
});
if (networked !== undefined) {
  const net = networked;
  await attempt('netInterfaces', async () => (await net.exec(['sh', '-c', "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '"])).stdout.trim());
  await attempt('netExec', async () => (await net.exec(['id', '-u'])).stdout.trim());
  if (hostAddress !== '-') {
    await attempt('netConnect', async () => {
      const r = await net.exec(['bash', '-c', `exec 3<>/dev/tcp/${hostAddress}/${port} && head -n 1 <&3`], { timeoutMs: 15_000 });
      return r.stdout.trim() || r.stderr.trim();
    });
  }
  await net.stop();
}
process.stdout.write(`${JSON.stringify(out)}\n`);
