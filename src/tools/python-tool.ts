import { z } from 'zod';
import { RolloutError } from '../errors.js';
import type { ExecResult, Sandbox } from '../sandboxes/types.js';
import { defineTool, type ValidatedTool } from './define-tool.js';
import { fileLimitProblem } from './file-limit.js';

export interface PythonToolOptions {
  /** Per-call timeout, ms (also bounded by the sandbox's remaining wall clock). Default 10 s. */
  timeoutMs?: number;
  /** Interpreter inside the sandbox. Default `python3` (the sandbox binds the host's installation). */
  interpreter?: string;
}

/** Work-dir folder holding the code cells; hidden so `ls` in the work dir shows the model's own files. */
const CELL_DIR = '.rollout/python';

/**
 * The `python` tool: writes the code to a cell file in the sandbox's work dir and runs it with the sandbox's
 * Python under a timeout. The observation is stdout, then stderr when non-empty, then notes on timeout,
 * truncation and a non-zero exit code; outcome 'error' on non-zero exit or timeout.
 *
 * Why a file and not `python -c`: tracebacks then name a real file and line, and the code size is not bound
 * by argv limits. PYTHONPATH is the work dir, so the code can import modules the model wrote there.
 * Each call is a fresh interpreter: state does not carry over between calls (files do).
 */
export function createPythonTool(options: PythonToolOptions = {}): ValidatedTool {
  const timeoutMs = options.timeoutMs ?? 10_000;
  const interpreter = options.interpreter ?? 'python3';
  const cells = new WeakMap<Sandbox, number>();
  return defineTool({
    name: 'python',
    description:
      `Run a Python 3 program in the sandbox and return its stdout and stderr. Each call starts a fresh interpreter ` +
      `(variables do not persist; files in the working directory do). Print what you want to see. Time limit ${Math.round(timeoutMs / 1000)} s.`,
    args: z.object({ code: z.string().describe('The complete Python program to run.') }),
    async run({ code }, { sandbox, signal }) {
      const n = (cells.get(sandbox) ?? 0) + 1;
      cells.set(sandbox, n);
      const file = `${sandbox.workdir}/${CELL_DIR}/cell_${n}.py`;
      const tooLarge = fileLimitProblem(sandbox, file, code);
      if (tooLarge !== undefined) return { output: `Error: could not write the code cell: ${tooLarge}`, outcome: 'error' };
      try {
        await sandbox.writeFile(file, code, { signal });
      } catch (err) {
        // The model can break the cell directory (replace it with a file, plant a symlink): its own doing, so an
        // observation it can react to — not a failed task. Sandbox failures stay errors.
        if (err instanceof RolloutError && (err.code === 'invalid_argument' || err.code === 'not_found')) {
          return { output: `Error: could not write the code cell ${file}: ${err.message}`, outcome: 'error' };
        }
        throw err;
      }
      const result = await sandbox.exec([interpreter, file], { timeoutMs, signal, env: { PYTHONPATH: sandbox.workdir } });
      const failed = result.timedOut || result.exitCode !== 0;
      return { output: formatExecObservation(result, timeoutMs), outcome: failed ? 'error' : 'ok' };
    },
  });
}

/**
 * Renders an exec result as an observation: stdout, `[stderr]` and stderr when non-empty, then bracketed notes.
 * Shared by process-running tools so the model sees one format.
 */
export function formatExecObservation(result: ExecResult, timeoutMs: number): string {
  const parts: string[] = [];
  if (result.stdout.length > 0) parts.push(result.stdout.replace(/\n$/, ''));
  if (result.stderr.length > 0) parts.push(`[stderr]\n${result.stderr.replace(/\n$/, '')}`);
  if (result.truncated) parts.push('[output truncated: only the beginning of the output is shown]');
  // Its exit status stands: a server or worker it started in the background is the model's to know about, not a hang.
  if (result.outputHeld === true) parts.push('[the program exited, but a process it started is still running and holds its output: what that process prints is not shown]');
  if (result.timedOut) parts.push(`[timed out after ${formatSeconds(Math.min(timeoutMs, result.durationMs))}; the program was killed]`);
  else if (result.exitCode !== 0) parts.push(result.exitCode === null ? `[killed by ${result.signal ?? 'a signal'}]` : `[exit code ${result.exitCode}]`);
  return parts.length > 0 ? parts.join('\n') : '(no output)';
}

function formatSeconds(ms: number): string {
  return `${Math.round(ms / 100) / 10} s`;
}
