import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { SANDBOX_INIT_PATH } from '../../src/sandboxes/init/sandbox-init.js';
import { closeAfterAll, testSpec } from './helpers.js';

const driver = closeAfterAll(new BubblewrapDriver());
const hostNetwork = closeAfterAll(new BubblewrapDriver({ network: 'host' }));

describe('bubblewrap sandbox isolation', () => {
  let sandbox: BubblewrapSandbox;
  let hostDir: string;
  let server: Server;
  let port: number;
  let connections = 0;

  beforeAll(async () => {
    sandbox = await driver.start(testSpec());
    hostDir = await mkdtemp(join(tmpdir(), 'bwrap-isolation-'));
    server = createServer((socket) => {
      connections++;
      socket.end('hello from the host\n');
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as { port: number }).port;
  });

  afterAll(async () => {
    await sandbox?.stop();
    await rm(hostDir, { recursive: true, force: true });
    await new Promise((resolve) => server?.close(resolve));
  });

  it('runs python3 inside the sandbox, in the work dir', async () => {
    const r = await sandbox.exec(['python3', '-c', 'import os, sys; print(os.getcwd()); print(sys.version_info[0])']);
    expect(r).toMatchObject({ exitCode: 0, timedOut: false, truncated: false, stderr: '' });
    expect(r.stdout).toBe('/work\n3\n');
  });

  it('cannot see a host file outside the sandbox, nor the project checkout', async () => {
    const marker = join(hostDir, 'marker.txt');
    await writeFile(marker, 'secret');
    const code = `import os; print(os.path.exists(${JSON.stringify(marker)}), os.path.exists(${JSON.stringify(process.cwd())}), os.path.exists('/etc/shadow'))`;
    const r = await sandbox.exec(['python3', '-c', code]);
    expect(r.stdout).toBe('False False False\n');
  });

  it('sees only its own processes in /proc', async () => {
    const code = [
      'import json, os',
      'pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]',
      'print(json.dumps({p: open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0")[0].decode() for p in pids}))',
    ].join('\n');
    const r = await sandbox.exec(['python3', '-c', code]);
    const procs = JSON.parse(r.stdout) as Record<string, string>;
    // The sandbox init (pid 1, the holder) and this python; nothing of the host.
    expect(Object.keys(procs).length).toBe(2);
    expect(procs['1']).toBe(SANDBOX_INIT_PATH);
    expect(Object.values(procs)).toContain('python3');
  });

  it('has no network: a connection to a port the host listens on fails', async () => {
    const code = `
import socket
try:
    socket.create_connection(("127.0.0.1", ${port}), timeout=3).recv(100)
    print("connected")
except OSError as e:
    print("failed", type(e).__name__)
`;
    const r = await sandbox.exec(['python3', '-c', code]);
    expect(r.stdout).toMatch(/^failed/);
    expect(connections).toBe(0);
  });

  it("reaches the host's loopback when the sandbox asks for network under networkMode 'host' (the check above is not vacuous)", async () => {
    // The default ('isolated', slirp4netns) cuts the host's loopback off: review-s39-isolated-network.test.ts.
    const networked = await hostNetwork.start(testSpec({ network: true }));
    try {
      const code = `import socket; print(socket.create_connection(("127.0.0.1", ${port}), timeout=3).recv(100).decode().strip())`;
      const r = await networked.exec(['python3', '-c', code]);
      expect(r.stdout).toBe('hello from the host\n');
      expect(connections).toBe(1);
    } finally {
      await networked.stop();
    }
  });

  it('keeps /, /usr and /etc read-only and the work dir and /tmp writable', async () => {
    const r = await sandbox.exec(['sh', '-c', 'for p in /usr/x /etc/x /x /root/x; do touch $p 2>/dev/null && echo $p-writable; done; echo ok > /work/w.txt && cat /work/w.txt && touch /tmp/t && echo tmp-ok']);
    expect(r.stdout).toBe('ok\ntmp-ok\n');
  });

  it('starts from a clean environment plus the requested variables', async () => {
    process.env.ROLLOUT_TEST_HOST_SECRET = 'do-not-leak';
    try {
      const code = 'import os; print(os.environ.get("ROLLOUT_TEST_HOST_SECRET"), os.environ["EXTRA"], os.environ["PYTHONDONTWRITEBYTECODE"], os.environ["HOME"])';
      const r = await sandbox.exec(['python3', '-c', code], { env: { EXTRA: 'yes' } });
      expect(r.stdout).toBe('None yes 1 /work\n');
    } finally {
      delete process.env.ROLLOUT_TEST_HOST_SECRET;
    }
  });

  it('passes stdin and honours cwd inside the work dir', async () => {
    await sandbox.writeFile('sub/data.txt', 'x');
    const r = await sandbox.exec(['python3', '-c', 'import os, sys; print(os.getcwd(), sys.stdin.read().upper())'], { stdin: 'abc', cwd: 'sub' });
    expect(r.stdout).toBe('/work/sub ABC\n');
    await expect(sandbox.exec(['true'], { cwd: 'missing' })).rejects.toMatchObject({ code: 'invalid_argument' });
  });

  it('also works with a user namespace (the rootless mode of non-root hosts)', async () => {
    const userns = new BubblewrapDriver({ identity: 'userns' });
    const s = await userns.start(testSpec());
    try {
      const r = await s.exec(['python3', '-c', `import os; print(os.path.exists(${JSON.stringify(hostDir)}), len([p for p in os.listdir("/proc") if p.isdigit()]) <= 4)`]);
      expect(r.stdout).toBe('False True\n');
    } finally {
      await s.stop();
    }
  });
});
