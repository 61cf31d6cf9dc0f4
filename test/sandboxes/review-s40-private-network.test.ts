import { spawn } from 'node:child_process';
import { accessSync, chmodSync, constants, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config.js';
import { createSandboxDriver } from '../../src/sandboxes/driver-factory.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import { defaultNetworkPolicy, PRIVATE_DESTINATIONS, policyBatches } from '../../src/sandboxes/slirp-network.js';
import { silentLogger } from '../../src/observability/logger.js';
import { closeAfterAll, processesInOurCgroups, testSpec } from './helpers.js';

// Review s40: a bubblewrap sandbox started with `network: true` (sandbox.networkMode 'isolated', the default) reached,
// through slirp4netns, everything the host reaches but its loopback: the cloud metadata service (169.254.169.254: a
// model that can pip install could read the instance's credentials), the LAN (RFC 1918, CGNAT) and the host's own
// non-loopback addresses (services on 0.0.0.0). Now the server sets policy routing rules in the sandbox's network
// namespace before the sandbox runs anything (src/sandboxes/slirp-network.ts: NetworkPolicy): those destinations are
// refused inside it (EACCES), slirp4netns's DNS forwarder 10.0.2.3 port 53 stays open, and an operator can allow
// CIDRs back (sandbox.networkAllow). The sandbox's processes cannot undo the rules (no CAP_NET_ADMIN over the
// namespace).
//
// Nothing here sends a packet to an address outside this machine: the stand-in server (review-s40-private-network-cli.ts)
// runs in a network namespace the test made (unshare --net) whose only link is a veth pair to a second namespace of
// the test's, "the outside", which holds the addresses a sandbox must not reach and one it may (203.0.113.80, the
// internet's stand-in), each with a listener that logs what arrives (review-s40-net-listeners.py). The stand-in's own
// ("the host's") address is 198.51.100.7; its resolver (a private mount namespace's /etc/resolv.conf) is 10.53.0.1 in
// the outside, a DNS responder answering 203.0.113.9. The stand-in runs as root, and as uid 4242 (the rootless path).

const UID = 4242;
const onPath = (tool: string): string | undefined =>
  ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin'].map((d) => join(d, tool)).find((p) => {
    try {
      accessSync(p, constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
const skipReason =
  process.getuid?.() !== 0 ? 'the test process is not root (it makes network namespaces and runs a stand-in as another uid)'
  : ['slirp4netns', 'ip', 'setpriv', 'unshare', 'nsenter', 'python3'].map((t) => (onPath(t) ? undefined : `${t} is not installed`)).find((r) => r !== undefined);
// CI runs tests as root with scripts/setup.sh's tools: nothing skips there.
const skip = skipReason !== undefined && process.env.CI !== 'true';
const skipNote = skip ? ` — SKIPPED: ${skipReason}` : '';

const root = fileURLToPath(new URL('../..', import.meta.url));
const cli = fileURLToPath(new URL('./review-s40-private-network-cli.ts', import.meta.url));
const listeners = fileURLToPath(new URL('./review-s40-net-listeners.py', import.meta.url));

/** Outside addresses a sandbox must not reach, and the internet's stand-in it must. */
const OUTSIDE = ['169.254.169.254', '10.20.30.40', '192.168.77.1', '172.16.77.1', '100.64.77.1', '10.53.0.1', '203.0.113.80'];
const HOST = '198.51.100.7';

/**
 * Run in `unshare --net --mount`: $1 the test's directory, $2 `tun` when /dev/net/tun must be made usable by all (see
 * review-s39-rootless.test.ts), the rest the stand-in's argv. Builds the two namespaces and the listeners, runs the
 * stand-in, then ends what it started, by pid.
 */
const SETUP = `
set -e
dir=$1; tun=$2; shift 2
ip link set lo up
ip link add h0 type veth peer name h1
unshare --net sleep 600 &
outside=$!
l1=; l2=
trap 'kill $outside $l1 $l2 2>/dev/null || true' EXIT
i=0
while [ "$(readlink /proc/$outside/ns/net)" = "$(readlink /proc/$$/ns/net)" ]; do i=$((i + 1)); [ $i -lt 500 ]; sleep 0.01; done
ip link set h1 netns $outside
ip link set h0 up
ip addr add ${HOST}/24 dev h0
ip -6 addr add fd00:77::7/64 dev h0 nodad
ip route add default via 198.51.100.1
nsenter -t $outside -n sh -ec 'ip link set lo up; ip link set h1 up; ip addr add 198.51.100.1/24 dev h1
  ip -6 addr add fd00:77::1/64 dev h1 nodad; for a in ${OUTSIDE.join(' ')}; do ip addr add $a/32 dev h1; done'
echo "nameserver 10.53.0.1" > "$dir/resolv.conf"
mount --bind "$dir/resolv.conf" /etc/resolv.conf
if [ "$tun" = tun ]; then mknod "$dir/tun" c 10 200; chmod 0666 "$dir/tun"; mount --bind "$dir/tun" /dev/net/tun; fi
nsenter -t $outside -n python3 ${listeners} "$dir/connections.log" ${OUTSIDE.join(' ')} fd00:77::1 dns=10.53.0.1 mcast=198.51.100.1 > "$dir/outside.ready" &
l1=$!
python3 ${listeners} "$dir/connections.log" ${HOST} mcast=${HOST} > "$dir/host.ready" &
l2=$!
i=0
until grep -q ready "$dir/outside.ready" && grep -q ready "$dir/host.ready"; do i=$((i + 1)); [ $i -lt 1000 ]; sleep 0.01; done
"$@"
`;

interface Report {
  uid: number;
  start: unknown;
  probes: Record<string, string>;
  netAdmin: { stdout: string; stderr: string };
  afterNetAdmin: Record<string, string>;
  allowStart: unknown;
  allowProbes: Record<string, string>;
}

async function runStandIn(dir: string, asUser: boolean): Promise<{ report: Report; log: string[] }> {
  const node = [process.execPath, '--import', 'tsx', cli];
  const standIn = asUser ? [onPath('setpriv')!, `--reuid=${UID}`, `--regid=${UID}`, '--clear-groups', '--', ...node] : node;
  const tunForAll = ((statSync('/dev/net/tun', { throwIfNoEntry: false })?.mode ?? 0o666) & 0o006) === 0o006;
  const argv = ['unshare', '--net', '--mount', '--propagation', 'private', '/bin/sh', '-c', SETUP, 'review-s40-net', dir, asUser && !tunForAll ? 'tun' : '-', ...standIn];
  const child = spawn(argv[0]!, argv.slice(1), {
    cwd: root, env: { PATH: `${join(process.execPath, '..')}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`, HOME: dir, LANG: 'C.UTF-8' }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
  if (code !== 0) throw new Error(`the stand-in exited ${code}: ${stderr.slice(-3000)}`);
  const log = existsSync(join(dir, 'connections.log')) ? readFileSync(join(dir, 'connections.log'), 'utf8').split('\n').filter(Boolean) : [];
  return { report: JSON.parse(stdout.trim().split('\n').pop()!) as Report, log };
}

describe.skipIf(skip).each([
  { who: 'root', asUser: false },
  { who: `uid ${UID} (rootless)`, asUser: true },
])(`isolated sandboxes of a server running as $who cannot reach private addresses${skipNote}`, ({ asUser }) => {
  let dir: string;
  let report: Report;
  let log: string[];

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'review-s40-net-'));
    chmodSync(dir, 0o777);
    writeFileSync(join(dir, 'connections.log'), '');
    ({ report, log } = await runStandIn(dir, asUser));
  }, 180_000);

  afterAll(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('runs as the identity asked, and the network works: the internet stand-in answers', () => {
    expect(report.uid).toBe(asUser ? UID : 0);
    expect(report.start).toBe('ok');
    expect(report.probes['tcp:203.0.113.80']).toBe('ok hello from 203.0.113.80');
  });

  it("refuses cloud metadata, the LAN (RFC 1918, CGNAT), the resolver's other ports and the host's own address — nothing arrives there", () => {
    for (const host of ['169.254.169.254', '10.20.30.40', '192.168.77.1', '172.16.77.1', '100.64.77.1', '10.53.0.1', HOST, '10.0.2.2', '10.0.2.3']) {
      expect(report.probes[`tcp:${host}`], host).toBe('failed PermissionError');
    }
    // IPv6: slirp4netns carries none, and a rule refuses it in the namespace all the same.
    expect(report.probes['tcp:fd00:77::1']).toMatch(/^failed /);
    const reached = log.filter((l) => l.startsWith('tcp ') && l !== 'tcp 203.0.113.80' && l !== 'tcp 192.168.77.1');
    expect(reached).toEqual([]);
  });

  it('still refuses them from a socket bound to tap0 (the kernel then tries the refused destination on-link), and relays no multicast', () => {
    expect(report.probes['dev:169.254.169.254']).toMatch(/^failed /);
    expect(report.probes['dev:10.0.2.3']).toMatch(/^failed /);
    expect(report.probes.mcast).toBe('sent');
    expect(log.filter((l) => l === 'tcp 169.254.169.254' || l === 'tcp 10.53.0.1' || l === 'mcast')).toEqual([]);
  });

  it("resolves names through slirp4netns's DNS forwarder 10.0.2.3, although the resolver is on a private address", () => {
    expect(report.probes['dns:metadata.test']).toBe('203.0.113.9');
    expect(log).toContain('dns 10.53.0.1');
  });

  it("gives the sandbox's processes no way to change the rules (no CAP_NET_ADMIN over the namespace)", () => {
    expect(report.netAdmin.stdout).toMatch(/^CapEff:\s+0+$/m);
    expect(report.netAdmin.stdout).toMatch(/^rule del: [1-9]/m);
    expect(report.netAdmin.stdout).toMatch(/^rule add: [1-9]/m);
    expect(report.netAdmin.stdout).toMatch(/^route add: [1-9]/m);
    expect(report.netAdmin.stderr).toMatch(/Operation not permitted/);
    expect(report.afterNetAdmin['tcp:169.254.169.254']).toBe('failed PermissionError');
  });

  it('lets an operator allow a private range back (sandbox.networkAllow), and only that one', () => {
    expect(report.allowStart).toBe('ok');
    expect(report.allowProbes).toEqual({ 'tcp:192.168.77.1': 'ok hello from 192.168.77.1', 'tcp:169.254.169.254': 'failed PermissionError', 'tcp:10.20.30.40': 'failed PermissionError' });
    expect(log.filter((l) => l === 'tcp 192.168.77.1')).toHaveLength(1);
  });
});

describe('the private-destination policy', () => {
  it('lets the DNS forwarder through first, then what the operator allowed, then refuses the private ranges and the host', () => {
    const { ipv4, ipv6 } = policyBatches({ blocked: ['10.0.0.0/8', '198.51.100.7/32'], allowed: ['10.1.0.0/16'] });
    expect(ipv4.split('\n')).toEqual([
      'rule add pref 10000 to 10.0.2.3/32 ipproto udp dport 53 lookup main',
      'rule add pref 10001 to 10.0.2.3/32 ipproto tcp dport 53 lookup main',
      'rule add pref 10002 to 10.1.0.0/16 lookup main',
      'rule add pref 10003 to 10.0.0.0/8 prohibit',
      'rule add pref 10004 to 198.51.100.7/32 prohibit',
      '',
    ]);
    expect(ipv6).toBe('rule add pref 10005 prohibit\n');
    const policy = defaultNetworkPolicy();
    for (const cidr of ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '169.254.0.0/16', '100.64.0.0/10']) expect(policy.blocked).toContain(cidr);
    expect(policy.blocked.slice(PRIVATE_DESTINATIONS.length).every((c) => c.endsWith('/32') && !c.startsWith('127.'))).toBe(true);
  });

  it('sandbox.networkAllow takes IPv4 CIDRs only, refused naming the field otherwise; config reaches the driver', () => {
    expect(parseConfig({}).sandbox.networkAllow).toEqual([]);
    expect(parseConfig({ sandbox: { networkAllow: ['10.1.0.0/16', '0.0.0.0/0'] } }).sandbox.networkAllow).toEqual(['10.1.0.0/16', '0.0.0.0/0']);
    for (const bad of ['10.1.0.0', '10.1.0.0/33', '300.1.0.0/16', 'fd00::/8', 'lan']) {
      expect(() => parseConfig({ sandbox: { networkAllow: [bad] } }), bad).toThrow(expect.objectContaining({ code: 'invalid_argument', field: 'sandbox.networkAllow.0' }));
      expect(() => new BubblewrapDriver({ networkAllow: [bad] }), bad).toThrow(expect.objectContaining({ code: 'invalid_argument', field: 'sandbox.networkAllow' }));
    }
    expect(() => createSandboxDriver(parseConfig({ sandbox: { networkAllow: ['10.1.0.0/16'] } }).sandbox, silentLogger())).not.toThrow();
  });
});

describe.skipIf(skip)(`a policy that cannot be set fails the sandbox (sandbox_error), never leaving it open${skipNote}`, () => {
  // The `ip` binary is the seam (BubblewrapDriverOptions.ipPath): one that does not exist.
  const driver = closeAfterAll(new BubblewrapDriver({ ipPath: '/nonexistent/ip' }));
  const allowingAll = closeAfterAll(new BubblewrapDriver({ ipPath: '/nonexistent/ip', networkAllow: ['0.0.0.0/0'] }));

  it('names iproute2 and leaves no process behind', async () => {
    await expect(driver.start(testSpec({ network: true }))).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringMatching(/restrict the sandbox's network.*iproute2/s) });
    expect(processesInOurCgroups()).toEqual([]);
  });

  it('needs no ip where the operator allowed everything (sandbox.networkAllow 0.0.0.0/0)', async () => {
    const open = await allowingAll.start(testSpec({ network: true }));
    try {
      expect((await open.exec(['ip', 'rule'])).stdout).not.toMatch(/prohibit/);
    } finally {
      await open.stop();
    }
  });
});
