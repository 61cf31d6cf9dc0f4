import { describe, expect, it } from 'vitest';
import { diffWorkingCopy, prepareWorkingCopy, UnreadableWorkingCopy } from '../../../src/environments/swe/repo-ops.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { sweRepo } from '../../support/swe-repo.js';

/**
 * Review s42 (helper-103): the agent's diff is taken by git in the agent's own sandbox, whose HOME (the workspace) and
 * working copy's .git the agent wrote. Git configuration planted there (a broken ~/.gitconfig; a clean filter or an
 * fsmonitor hook that never returns) failed or hung both ways of taking the diff: an environment_error (or the eval's
 * TIMEOUT), which trainers drop instead of the 0 the policy earned; so did a /tmp (or workspace) the agent filled.
 * Real bubblewrap sandboxes of the SWE base image.
 */
const REPO = {
  'calc.py': 'def add(a, b):\n    return a - b\n',
  'tests/test_calc.py': 'from calc import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n',
};

describe.runIf(process.getuid?.() === 0 || process.env.CI)("the agent's git configuration and the diff", () => {
  const fx = sweRepo('rollout-swe-agent-git-', REPO);

  async function agentSandbox(): Promise<Sandbox> {
    return fx.start({ commandTimeoutMs: 120_000, wallClockMs: 300_000 });
  }

  const plants: Record<string, string> = {
    'a ~/.gitconfig git cannot parse': `printf '[core\\n' > "$HOME/.gitconfig"`,
    'a ~/.gitconfig whose clean filter never returns, on every file': `printf '[filter "x"]\\n\\tclean = sleep 100000\\n' > "$HOME/.gitconfig" && echo '* filter=x' > .gitattributes`,
    'a clean filter of the working copy\'s .git that never returns': `git config filter.y.clean 'sleep 100000' && echo '* filter=y' > .git/info/attributes`,
    'an fsmonitor hook of the working copy\'s .git that never returns': `printf '#!/bin/sh\\nsleep 100000\\n' > /work/hook && chmod +x /work/hook && git config core.fsmonitor /work/hook`,
  };

  for (const [what, plant] of Object.entries(plants)) {
    it(`takes the agent's diff whatever its git configuration: ${what}`, async () => {
      const agent = await agentSandbox();
      const dir = await prepareWorkingCopy(agent, '/testbed');
      const edit = await agent.exec(['bash', '-c', `sed -i "s/return a - b/return a + b/" calc.py && ${plant}`], { cwd: dir });
      expect(edit.exitCode, edit.stderr).toBe(0);
      const started = Date.now();
      const diff = await diffWorkingCopy(agent, '/testbed', dir, 1 << 20, { timeoutMs: 60_000 });
      expect(diff.patch).toContain('-    return a - b\n+    return a + b');
      expect(Date.now() - started).toBeLessThan(45_000);
    }, 120_000);
  }

  it("is the agent's doing (UnreadableWorkingCopy: reward 0 with the reason), not an environment_error, when the agent filled its /tmp, or its /tmp and workspace", async () => {
    for (const fill of ['head -c 2G /dev/zero > /tmp/fill', 'head -c 2G /dev/zero > /tmp/fill; head -c 2G /dev/zero > /work/fill']) {
      const agent = await agentSandbox();
      const dir = await prepareWorkingCopy(agent, '/testbed');
      await agent.exec(['bash', '-c', `sed -i "s/return a - b/return a + b/" calc.py; ${fill}; true`], { cwd: dir });
      const taken = diffWorkingCopy(agent, '/testbed', dir, 1 << 20, { timeoutMs: 60_000 });
      await expect(taken, fill).rejects.toBeInstanceOf(UnreadableWorkingCopy);
      await expect(taken, fill).rejects.toThrow(/no room left/);
    }
  }, 120_000);
});
