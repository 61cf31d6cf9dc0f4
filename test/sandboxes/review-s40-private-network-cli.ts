// Started by review-s40-private-network.test.ts as a server stand-in (as root, or under `setpriv --reuid` as a uid that
// is not root) inside a network namespace the test made (its addresses: see the test). Starts `network: true` bubblewrap
// sandboxes — one with the default policy, one whose operator allowed 192.168.77.0/24 (sandbox.networkAllow) — runs
// the probes of PROBE inside them and prints what each gave as one JSON object on stdout.
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../src/sandboxes/types.js';
import { testSpec } from './helpers.js';

/**
 * Python run in a sandbox: each argument is `tcp:HOST` (port 80), `dev:HOST` (port 80 from a socket bound to tap0,
 * which makes the kernel treat a refused route as on-link), `dns:NAME`, or `mcast` (one datagram to 224.0.0.251:5353
 * sent out of tap0, IP_MULTICAST_IF: multicast to a local group skips the routing rules). Prints a JSON object.
 */
const PROBE = `
import json, socket, sys
def tcp(host, dev=False):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family)
    s.settimeout(2)
    try:
        if dev:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"tap0")
        s.connect((host, 80))
        return "ok " + s.recv(100).decode().strip()
    except OSError as e:
        return "failed " + type(e).__name__
    finally:
        s.close()
out = {}
for arg in sys.argv[1:]:
    kind, _, what = arg.partition(":")
    if kind == "tcp":
        out[arg] = tcp(what)
    elif kind == "dev":
        out[arg] = tcp(what, dev=True)
    elif kind == "dns":
        try:
            out[arg] = socket.gethostbyname(what)
        except OSError as e:
            out[arg] = "failed " + type(e).__name__
    elif kind == "mcast":
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("10.0.2.100"))
            u.sendto(b"from the sandbox", ("224.0.0.251", 5353))
            out[arg] = "sent"
        except OSError as e:
            out[arg] = "failed " + type(e).__name__
print(json.dumps(out))
`;

const out: Record<string, unknown> = { uid: process.getuid?.() };
const attempt = async (name: string, step: () => Promise<unknown>): Promise<void> => {
  try {
    out[name] = await step();
  } catch (err) {
    out[name] = { error: String(err) };
  }
};
const probe = async (sandbox: Sandbox, args: string[]): Promise<unknown> => {
  const r = await sandbox.exec(['python3', '-c', PROBE, ...args], { timeoutMs: 60_000 });
  return r.exitCode === 0 ? JSON.parse(r.stdout) : { exitCode: r.exitCode, stderr: r.stderr };
};

const blocked = ['169.254.169.254', '10.20.30.40', '192.168.77.1', '172.16.77.1', '100.64.77.1', '10.53.0.1', '198.51.100.7', '10.0.2.2', '10.0.2.3'];
let sandbox: Sandbox | undefined;
await attempt('start', async () => {
  sandbox = await new BubblewrapDriver({}).start(testSpec({ network: true }));
  return 'ok';
});
if (sandbox !== undefined) {
  const sb = sandbox;
  await attempt('probes', () => probe(sb, [
    'tcp:203.0.113.80', ...blocked.map((h) => `tcp:${h}`), 'tcp:fd00:77::1', 'dev:169.254.169.254', 'dev:10.0.2.3', 'dns:metadata.test', 'mcast',
  ]));
  // Whether the sandbox's processes can change the rules (they must lack CAP_NET_ADMIN over the namespace).
  await attempt('netAdmin', async () => {
    const r = await sb.exec(['sh', '-c', [
      'grep CapEff /proc/self/status',
      'ip rule del to 169.254.0.0/16 prohibit; echo "rule del: $?"',
      'ip rule add pref 1 to 169.254.0.0/16 lookup main; echo "rule add: $?"',
      'ip route add 169.254.169.254/32 via 10.0.2.2; echo "route add: $?"',
    ].join('\n')]);
    return { stdout: r.stdout, stderr: r.stderr };
  });
  await attempt('afterNetAdmin', () => probe(sb, ['tcp:169.254.169.254']));
  await sb.stop();
}

let allowing: Sandbox | undefined;
await attempt('allowStart', async () => {
  allowing = await new BubblewrapDriver({ networkAllow: ['192.168.77.0/24'] }).start(testSpec({ network: true }));
  return 'ok';
});
if (allowing !== undefined) {
  const sb = allowing;
  await attempt('allowProbes', () => probe(sb, ['tcp:192.168.77.1', 'tcp:169.254.169.254', 'tcp:10.20.30.40']));
  await sb.stop();
}
process.stdout.write(`${JSON.stringify(out)}\n`);
