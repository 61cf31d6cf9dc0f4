import { createHash, randomBytes } from 'node:crypto';
import { RolloutError } from '../../errors.js';
import type { ExecResult, Sandbox } from '../../sandboxes/types.js';
import { bash, SCRATCH_DIR, type RunOptions } from './repo-ops.js';

/**
 * One run of the test command with the report plugin, and the channel the plugin reports on: the one part of the eval
 * where the agent's code runs, so nothing it can write afterwards is taken as the plugin's word.
 */

/**
 * Runs the test command ($4, evaluated by bash at the copy's root) with the report plugin on PYTHONPATH and in
 * PYTEST_ADDOPTS (after it, options of ours: $6); output to $5. The plugin's channel: fd 3 is this script's stdout
 * (read by the server, where nothing written can be taken back), fd 4 its stdin (the nonce, read once by the plugin);
 * the command's own stdin is /dev/null. Exit status: the command's.
 */
const RUN_TESTS = `cd "$1" || exit 125
export ROLLOUT_SWE_REPORT="$2"
export ROLLOUT_SWE_CHANNEL=3,4
export PYTHONPATH="$3\${PYTHONPATH:+:$PYTHONPATH}"
export PYTEST_ADDOPTS="-p rollout_swe_report $6 \${PYTEST_ADDOPTS:-}"
export PYTHONDONTWRITEBYTECODE=1
export ROLLOUT_SWE_ROOT="$1" ROLLOUT_SWE_PATCHED="$7" ROLLOUT_SWE_PROTECTED="$8"
command=$4 output=$5
shift 5
eval "$command" 3>&1 4<&0 </dev/null >"$output" 2>&1
`;

/** The largest pytest report read back (a real one is a few KB per test). */
const REPORT_MAX_BYTES = 64 << 20;

export interface TestRun {
  result: ExecResult;
  /** The plugin was imported and said so on its channel: pytest started. */
  started: boolean;
  /** The plugin's JSON, when pytest finished its session and the file is the one the plugin wrote. */
  report: string | undefined;
  /**
   * Why a report could not be used: a file over REPORT_MAX_BYTES, changed, deleted or replaced by what is not a regular
   * file after the plugin wrote it, or more than one report on the channel. The code under test can do all of these (it
   * runs as the same user), so this is the attempt's doing, not the environment's.
   */
  reportProblem?: string;
  /** The last bytes of the test command's output. */
  outputTail: string;
}

/**
 * Runs the test command with the report plugin (its source written to the scratch dir first). The plugin says on the
 * script's stdout, tagged with a nonce given only to it, that it started and the SHA-256 of the report it wrote; the
 * report file is taken only when it still has that hash (see rollout_swe_report.py).
 */
export async function runTests(
  sandbox: Sandbox,
  dir: string,
  command: string,
  plugin: { module: string; source: string },
  options: RunOptions & {
    /** Only collect (`--collect-only`): whether pytest starts, quickly. */
    collectOnly?: boolean;
    /**
     * A file in the sandbox listing (NUL-separated, relative to `dir`) what the agent's patch changed: an imperative
     * xfail raised through that code is the plugin's `xfail_by_code`, not an xfail (see rollout_swe_report.py).
     */
    patchedList?: string;
    /**
     * A file in the sandbox listing (NUL-separated, relative to `dir`) the test sources: the plugin reports those changed
     * while pytest ran (`tampered`, see rollout_swe_report.py).
     */
    protectedList?: string;
  } = {},
): Promise<TestRun> {
  const pluginDir = `${SCRATCH_DIR}/plugin`;
  const report = `${SCRATCH_DIR}/report.json`;
  const output = `${SCRATCH_DIR}/test-output.txt`;
  await sandbox.writeFile(`${pluginDir}/${plugin.module}.py`, plugin.source, { signal: options.signal });
  const nonce = randomBytes(16).toString('hex');
  // Whatever the tests left running is killed with the command: nothing of theirs outlives it to touch the report.
  const result = await sandbox.exec(['bash', '-c', RUN_TESTS, 'rollout-swe', dir, report, pluginDir, command, output, options.collectOnly ? '--collect-only' : '', options.patchedList ?? '', options.protectedList ?? ''], {
    signal: options.signal,
    timeoutMs: options.timeoutMs,
    cwd: sandbox.workdir,
    stdin: `${nonce}\n`,
    killLeftovers: true,
  });
  const channel = readChannel(result.stdout, nonce);
  // Only a regular file: the code under test may have put a FIFO there, whose open would wait for a writer until the
  // sandbox's command timeout. Race-free: the run killed whatever the tests left running (killLeftovers).
  const probe = await bash(sandbox, '[ -f "$1" ] || exit 0; tail -c 8192 -- "$1" 2>/dev/null || true', [output], { signal: options.signal });
  const outputTail = probe.stdout;
  if (!channel.started || channel.reports.length === 0) return { result, started: channel.started, report: undefined, outputTail };
  if (channel.reports.length > 1) return { result, started: true, report: undefined, reportProblem: `the plugin's channel carried ${channel.reports.length} reports, not one`, outputTail };
  let text: string;
  try {
    text = await sandbox.readFile(report, { signal: options.signal, maxBytes: REPORT_MAX_BYTES });
  } catch (err) {
    // Over the bound, gone, or no longer a regular file (a FIFO, a symlink to /dev/zero: readFile says invalid_argument
    // / not_found naming its path): anything else (the sandbox died) is the infrastructure's and propagates.
    if (!(err instanceof RolloutError) || (err.code !== 'invalid_argument' && err.code !== 'not_found')) throw err;
    const why = err.code === 'not_found'
      ? 'the report file was deleted after pytest wrote it'
      : / read limit$/.test(err.message) ? `the report file is over ${REPORT_MAX_BYTES >> 20} MiB` : `the report file cannot be read: ${err.message}`;
    return { result, started: true, report: undefined, reportProblem: why, outputTail };
  }
  if (createHash('sha256').update(text).digest('hex') !== channel.reports[0]) {
    return { result, started: true, report: undefined, reportProblem: 'the report file was changed after pytest wrote it (its SHA-256 is not the one the plugin sent)', outputTail };
  }
  return { result, started: true, report: text, outputTail };
}

/** The plugin's lines on the channel: whether it started, and the hash of each report it announced. */
function readChannel(stdout: string, nonce: string): { started: boolean; reports: string[] } {
  const prefix = `ROLLOUT-SWE ${nonce} `;
  let started = false;
  const reports: string[] = [];
  for (const line of stdout.split('\n')) {
    if (!line.startsWith(prefix)) continue; // not the plugin's: without the nonce, nobody else's words count
    const [kind, value] = line.slice(prefix.length).split(' ');
    if (kind === 'started') started = true;
    else if (kind === 'report' && value !== undefined) reports.push(value);
  }
  return { started, reports };
}
