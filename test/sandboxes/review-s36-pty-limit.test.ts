import { describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { MAX_PTYS_PER_SANDBOX } from '../../src/sandboxes/bwrap-ptys.js';
import { closeAfterAll, sandboxesStoppedAfterEach } from './helpers.js';

const driver = closeAfterAll(new BubblewrapDriver());
const start = sandboxesStoppedAfterEach<BubblewrapSandbox>();

/** Opens ptys (up to 200: this test must not drain the host's pool itself) and holds them until stdin closes. */
const HOARD = `
import os, sys
fds = []
try:
    while len(fds) < 200:
        fds.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    print("opened", len(fds), flush=True)
except OSError as e:
    print("opened", len(fds), e.errno, flush=True)
sys.stdin.read()
`;

// Review s36: bwrap's devpts instance had no limit of its own, and all devpts instances but the host's share one pool
// (kernel.pty.max − kernel.pty.reserve, 3072 by default). Measured: one sandbox opened 3071 ptys, after which
// os.openpty() in every other sandbox of the host failed with ENOSPC.
describe('ptys of a bubblewrap sandbox', () => {
  it(`are limited to ${MAX_PTYS_PER_SANDBOX} per sandbox, and other sandboxes still get theirs`, async () => {
    const [hoarder, other] = await Promise.all([start(driver), start(driver)]);
    const proc = hoarder.spawn(['python3', '-c', HOARD]);
    const line = await new Promise<string>((resolve) => {
      let out = '';
      proc.stdout.on('data', (c: Buffer) => {
        out += c.toString();
        if (out.includes('\n')) resolve(out.trim());
      });
    });
    try {
      expect(line).toBe(`opened ${MAX_PTYS_PER_SANDBOX} 28`); // ENOSPC at the sandbox's own limit
      const r = await other.exec(['python3', '-c', 'import os; m, s = os.openpty(); print(os.ttyname(s))']);
      expect(r).toMatchObject({ exitCode: 0, stdout: '/dev/pts/0\n' });
      expect(driver.capabilities.ptyLimit).toBe(true);
    } finally {
      proc.kill();
    }
  }, 60_000);
});
