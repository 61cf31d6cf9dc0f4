import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { parseConfig } from '../../src/config.js';
import { CODE_SANDBOX_MEMORY_HEADROOM_MB, codeGradingSandbox, codeSandbox } from '../../src/environments/code/code-environment.js';
import { validateCodeInstance } from '../../src/environments/code/instance.js';
import { defaultImagePath } from '../../src/sandboxes/images/image-recipe.js';
import { DEFAULT_MAX_SANDBOX_MEMORY_MB, resolveSandboxSpec } from '../../src/sandboxes/spec.js';
import { collect } from '../support/harness.js';
import { liveSandboxes, runTasks, startServerHarness, type ServerHarness } from '../support/server-harness.js';

// Review s44. A code task's `memory_limit_mb` (up to 65,536, default 1024) is stated in the prompt and enforced per test
// process (RLIMIT_AS), but the sandbox its tests ran in had the server's `sandbox.memoryMb` (default 1024) for
// everything: with a stated limit above it (or equal to it: the judge's Python shares the sandbox), a correct solution
// using memory within its stated limit was killed by the sandbox's limit, reward 0 — a false negative the trainer
// learns from. The sandbox now gets the task's limit plus the judge's headroom when that is more than the server's
// default, up to `sandbox.maxMemoryMb` (default 4096): a task needing more is refused at submit, naming the instance.

describe('an instance asking for sandbox memory (resolveSandboxSpec)', () => {
  const config = parseConfig({ sandbox: { memoryMb: 1024 } }).sandbox;

  it('minMemoryMb raises the memory, never lowers it', () => {
    expect(resolveSandboxSpec(config, { minMemoryMb: 3000 }, 60_000).limits.memoryMb).toBe(3000);
    expect(resolveSandboxSpec(config, { minMemoryMb: 100 }, 60_000).limits.memoryMb).toBe(1024);
    expect(resolveSandboxSpec(config, { minMemoryMb: 100, limits: { memoryMb: 512 } }, 60_000).limits.memoryMb).toBe(512);
    expect(resolveSandboxSpec(config, undefined, 60_000).limits.memoryMb).toBe(1024);
  });

  it('more than sandbox.maxMemoryMb is the task\'s (invalid_argument, field instance), by either field', () => {
    const over = { code: 'invalid_argument', field: 'instance', message: expect.stringContaining(`at most ${DEFAULT_MAX_SANDBOX_MEMORY_MB} MiB (sandbox.maxMemoryMb)`) };
    expect(resolveSandboxSpec(config, { minMemoryMb: DEFAULT_MAX_SANDBOX_MEMORY_MB }, 60_000).limits.memoryMb).toBe(DEFAULT_MAX_SANDBOX_MEMORY_MB);
    expect(() => resolveSandboxSpec(config, { minMemoryMb: DEFAULT_MAX_SANDBOX_MEMORY_MB + 1 }, 60_000)).toThrow(expect.objectContaining(over));
    expect(() => resolveSandboxSpec(config, { limits: { memoryMb: 65_536 } }, 60_000)).toThrow(expect.objectContaining(over));
    const raised = parseConfig({ sandbox: { maxMemoryMb: 70_000 } }).sandbox;
    expect(resolveSandboxSpec(raised, { minMemoryMb: 65_536 }, 60_000).limits.memoryMb).toBe(65_536);
    // Never below the server's own default: a server configured with more memory than the default maximum still starts its sandboxes.
    const big = parseConfig({ sandbox: { memoryMb: 8192 } }).sandbox;
    expect(resolveSandboxSpec(big, undefined, 60_000).limits.memoryMb).toBe(8192);
  });

  it('a malformed minMemoryMb is the plugin\'s mistake (environment_error)', () => {
    for (const bad of [0, -1, 1.5, Number.NaN]) {
      expect(() => resolveSandboxSpec(config, { minMemoryMb: bad }, 60_000)).toThrow(expect.objectContaining({ code: 'environment_error', message: expect.stringContaining('minMemoryMb') }));
    }
  });

  it("the code environment's episode and grading sandboxes ask for the task's limit plus the judge's headroom", () => {
    const instance = validateCodeInstance({ statement: 's', tests: [{ input: '1\n', output: '1\n' }], memory_limit_mb: 2048 });
    expect(codeSandbox(instance).minMemoryMb).toBe(2048 + CODE_SANDBOX_MEMORY_HEADROOM_MB);
    expect(codeGradingSandbox(instance).minMemoryMb).toBe(2048 + CODE_SANDBOX_MEMORY_HEADROOM_MB);
    const defaults = validateCodeInstance({ statement: 's', tests: [{ input: '1\n', output: '1\n' }] });
    expect(resolveSandboxSpec(config, codeGradingSandbox(defaults), 60_000).limits.memoryMb).toBe(1024 + CODE_SANDBOX_MEMORY_HEADROOM_MB);
  });
});

const image = defaultImagePath();
const COMPLETED = TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED;
const fence = (code: string) => `Here is my solution.\n\n\`\`\`python\n${code}\n\`\`\``;
/** Python that makes `mib` MiB resident (written), then prints the sum of two integers. */
const summing = (mib: number) => `_held = b"x" * (${mib} << 20)\na, b = map(int, input().split())\nprint(a + b)`;
const instance = (memoryLimitMb: number) => ({
  statement: 'Read two integers a and b and print a + b.',
  tests: [
    { input: '1 2\n', output: '3\n' },
    { input: '10 -4\n', output: '6\n' },
  ],
  time_limit_s: 20,
  memory_limit_mb: memoryLimitMb,
});


describe.runIf(existsSync(image) || process.env.CI)('a code task whose memory limit exceeds the server\'s sandbox memory (real server, bubblewrap sandboxes)', () => {
  let h: ServerHarness;
  // The fake engine (test double) answers with the program the task's seed names.
  const programs = [summing(400), summing(700)];

  beforeAll(async () => {
    // A small server default (256 MiB per sandbox), so the case costs little memory; the task states 512 MiB.
    h = await startServerHarness({
      engine: { policy: (_prompt, ctx) => fence(programs[ctx.seed] ?? 'print()') },
      config: { sandbox: { image, memoryMb: 256, maxMemoryMb: 1024 } },
    });
  });
  afterAll(async () => h?.close());

  const sampling = (seed: number) => ({ temperature: 1, seed, maxTokensPerTurn: 1024, maxTotalTokens: 8192, stop: [] });

  it('a correct solution using 400 MiB under its stated 512 passes; one over the stated limit still fails as its own', async () => {
    const results = await runTasks(h, [
      { taskId: 'within', environment: 'code', numSamples: 1, instance: instance(512), sampling: sampling(0) },
      { taskId: 'over', environment: 'code', numSamples: 1, instance: instance(512), sampling: sampling(1) },
    ]);
    const within = results.get('within')!;
    expect(within.status, within.error).toBe(COMPLETED);
    expect(within.reward, JSON.stringify(within.evalReport)).toBe(1);
    const over = results.get('over')!;
    expect(over.status, over.error).toBe(COMPLETED);
    expect(over.reward).toBe(0);
    expect((over.evalReport!.tests as { status: string }[])[0]!.status).toBe('runtime_error');
    expect(await liveSandboxes()).toEqual([]);
  }, 180_000);

  it('a task needing more than sandbox.maxMemoryMb is refused at submit, naming the instance; nothing else is lost', async () => {
    const session = h.client.openSession();
    const refused = await session.submit({ taskId: 'huge', environment: 'code', numSamples: 1, instance: instance(4096), sampling: sampling(0) }).catch((e: unknown) => e);
    expect(refused).toMatchObject({ field: 'instance', message: expect.stringContaining('sandbox.maxMemoryMb') });
    await session.submit({ taskId: 'after', environment: 'code', numSamples: 1, instance: instance(512), sampling: sampling(0) });
    session.close();
    const [after] = await collect(session.trajectories());
    expect(after).toMatchObject({ taskId: 'after', status: COMPLETED, reward: 1 });
  }, 180_000);
});
