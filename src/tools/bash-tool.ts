import { z } from 'zod';
import type { ShellResult } from '../sandboxes/types.js';
import { defineTool, type ValidatedTool } from './define-tool.js';

export interface BashToolOptions {
  /** Per-command timeout, ms (also bounded by the sandbox's remaining wall clock). Default 30 s. */
  timeoutMs?: number;
}

/** Longest command accepted: bash reads its input byte by byte, and a model pasting megabytes is a mistake. */
const MAX_COMMAND_CHARS = 100_000;

/**
 * The `bash` tool: runs a command in the sandbox's persistent shell (`sandbox.shell()`), so the working
 * directory, exported variables and `$?` carry over between calls, like a terminal. The observation is the
 * interleaved output, then notes on a non-zero exit code, a timeout and a restart of the shell; outcome 'error'
 * on a non-zero exit or a timeout. Stateless itself: the state lives in the sample's sandbox.
 */
export function createBashTool(options: BashToolOptions = {}): ValidatedTool {
  const timeoutMs = options.timeoutMs ?? 30_000;
  return defineTool({
    name: 'bash',
    description:
      `Run a bash command in a persistent shell in the sandbox and return its output (stdout and stderr). The working ` +
      `directory and exported variables persist between calls. Stdin is /dev/null: do not run interactive programs. ` +
      `Time limit ${Math.round(timeoutMs / 1000)} s per command; long output is truncated.`,
    args: z.object({ command: z.string().min(1).max(MAX_COMMAND_CHARS).describe('The bash command to run.') }),
    async run({ command }, { sandbox, signal }) {
      if (command.includes('\0')) return { output: 'Error: the command contains a NUL character.', outcome: 'error' };
      const result = await sandbox.shell().run(command, { timeoutMs, signal });
      return { output: formatShellObservation(result, timeoutMs), outcome: result.timedOut || result.exitCode !== 0 ? 'error' : 'ok' };
    },
  });
}

/** The observation of one shell command: its output, then bracketed notes (exit code, timeout, restart). */
export function formatShellObservation(result: ShellResult, timeoutMs: number): string {
  const parts: string[] = [];
  if (result.output.length > 0) parts.push(result.output.replace(/\n$/, ''));
  if (result.timedOut) parts.push(`[timed out after ${Math.round(timeoutMs / 100) / 10} s; the command was interrupted]`);
  else if (result.exitCode === null) parts.push(result.restartReason === undefined ? '[killed]' : '[exit code unknown]');
  else if (result.exitCode !== 0) parts.push(`[exit code ${result.exitCode}]`);
  if (result.restarted) {
    const reason = result.restartReason === undefined ? '' : `its state was lost because ${result.restartReason}; `;
    parts.push(`[the shell was restarted: ${reason}variables, functions and background jobs are gone; working directory is ${result.cwd}]`);
  }
  return parts.length > 0 ? parts.join('\n') : '(no output)';
}
