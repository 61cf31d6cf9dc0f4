import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config.js';
import { evalReserveMs } from '../../src/sandboxes/spec.js';
import { HostProcessSandbox } from '../../src/testing/host-process-sandbox.js';
import { createBashTool } from '../../src/tools/bash-tool.js';
import { executeToolCalls } from '../../src/tools/execute.js';
import { createPythonTool } from '../../src/tools/python-tool.js';
import { ToolTimeBudget } from '../../src/tools/tool-time-budget.js';
import { testSpec } from '../sandboxes/helpers.js';

// Review s40: the tool-time budget at the seam where tools run (executeToolCalls), on the host-process sandbox TEST
// DOUBLE (no isolation; the real pipeline with bubblewrap is review-s40-tool-time-budget.test.ts). The budget's
// commands are cut where it ends, whatever the tool's own timeout; calls after that are not run; what each call took is
// charged; the episode's sandbox is one object, so tools keying state by it keep their state.

describe('executeToolCalls with a tool-time budget', () => {
  let sandbox: HostProcessSandbox | undefined;
  afterEach(async () => sandbox?.stop());
  const signal = new AbortController().signal;
  const tools = [createBashTool({ timeoutMs: 30_000 }), createPythonTool({ timeoutMs: 30_000 })];
  const call = (name: string, args: Record<string, unknown>) => ({ name, arguments: args });

  it('cuts a shell command where the budget ends and does not run the calls after it', async () => {
    sandbox = await HostProcessSandbox.create(testSpec({ commandTimeoutMs: 60_000 }));
    const budget = new ToolTimeBudget(sandbox, { budgetMs: 700 });
    const started = performance.now();
    const observations = await executeToolCalls({ calls: [call('bash', { command: 'sleep 30' }), call('bash', { command: 'echo later' })], errors: [] }, tools, { sandbox, signal }, { toolTime: budget });
    const took = performance.now() - started;
    expect(took).toBeGreaterThanOrEqual(700);
    expect(took).toBeLessThan(10_000); // cut at the budget, not at the tool's 30 s
    expect(observations.map((o) => o.outcome)).toEqual(['error', 'error']);
    expect(observations[0]!.output).toContain('timed out');
    expect(observations[1]!.output).toBe("Not run: the episode's tool-time budget (700 ms) is used up.");
    expect(budget.exhausted).toBe(true);
    expect(budget.spentMs).toBeGreaterThanOrEqual(700);
  });

  it('cuts an exec-based tool (python) too, and charges quick calls without cutting them', async () => {
    sandbox = await HostProcessSandbox.create(testSpec({ commandTimeoutMs: 60_000 }));
    const budget = new ToolTimeBudget(sandbox, { budgetMs: 4_000 });
    const quick = await executeToolCalls({ calls: [call('python', { code: 'print(6 * 7)' })], errors: [] }, tools, { sandbox, signal }, { toolTime: budget });
    expect(quick).toMatchObject([{ outcome: 'ok', output: '42' }]);
    expect(budget.spentMs).toBeGreaterThan(0);
    expect(budget.exhausted).toBe(false);
    const slow = await executeToolCalls({ calls: [call('python', { code: 'while True: pass' })], errors: [] }, tools, { sandbox, signal }, { toolTime: budget });
    expect(slow[0]!.output).toContain('timed out');
    expect(budget.exhausted).toBe(true);
  });

  it('ends calls by `endBy` (the sandbox wall clock less the evaluation reserve) even with budget left', async () => {
    sandbox = await HostProcessSandbox.create(testSpec({ commandTimeoutMs: 60_000 }));
    const budget = new ToolTimeBudget(sandbox, { budgetMs: 600_000, endBy: performance.now() + 500 });
    const [o] = await executeToolCalls({ calls: [call('bash', { command: 'sleep 30' })], errors: [] }, tools, { sandbox, signal }, { toolTime: budget });
    expect(o!.output).toContain('timed out');
    expect(budget.exhausted).toBe(true);
    expect(budget.spentMs).toBeLessThan(10_000);
    // The sandbox itself is untouched and still runs commands (the evaluation's time).
    expect((await sandbox.exec(['echo', 'graded'])).stdout).toBe('graded\n');
  });

  it('keeps the shell state across calls (one budgeted sandbox per episode)', async () => {
    sandbox = await HostProcessSandbox.create(testSpec());
    const budget = new ToolTimeBudget(sandbox, { budgetMs: 60_000 });
    expect(budget.sandbox).toBe(budget.sandbox);
    await executeToolCalls({ calls: [call('bash', { command: 'export KEPT=yes' })], errors: [] }, tools, { sandbox, signal }, { toolTime: budget });
    const [o] = await executeToolCalls({ calls: [call('bash', { command: 'echo $KEPT' })], errors: [] }, tools, { sandbox, signal }, { toolTime: budget });
    expect(o!.output).toBe('yes');
  });
});

describe('the budget and the reserve as configured', () => {
  it('run.toolTimeShare defaults to 0.9 of the run timeout and must stay below it', () => {
    expect(parseConfig({}).run.toolTimeShare).toBe(0.9);
    expect(() => parseConfig({ run: { toolTimeShare: 1 } })).toThrow(/run\.toolTimeShare/);
    expect(() => parseConfig({ run: { toolTimeShare: 0 } })).toThrow(/run\.toolTimeShare/);
  });

  it("the evaluation keeps its stage's timeout of the sandbox's wall clock, at most a quarter of it", () => {
    expect(evalReserveMs(900_000, 60_000)).toBe(60_000);
    expect(evalReserveMs(10_000, 60_000)).toBe(2_500);
  });
});
