import { posix } from 'node:path';
import { RolloutError } from '../../errors.js';
import type { ExecResult, Sandbox } from '../../sandboxes/types.js';

/**
 * The repository operations of the SWE environment, each one bash script run inside a sandbox with its arguments
 * as positional parameters (never interpolated into the script). Images are read-only, so the agent and the eval
 * each work on a copy of the image's repository in the sandbox's writable workspace; the copy is a git repository
 * whose `refs/rollout/base` marks the image's state, the base every diff is taken against and applied to.
 */

/** Where the working copy of `repoPath` lives in a sandbox: `<workdir>/<basename>` (e.g. /work/testbed). */
export function workingCopyPath(sandbox: Sandbox, repoPath: string): string {
  return posix.join(sandbox.workdir, posix.basename(repoPath));
}

/** Private scratch space of the environment inside a sandbox (patches, the pytest plugin, the report). */
export const SCRATCH_DIR = '/tmp/rollout-swe';

/** The ref that marks the base in every working copy. */
const BASE_REF = 'refs/rollout/base';

const GIT_IDENTITY = '-c user.name=rollout -c user.email=rollout@localhost -c commit.gpgsign=false';

/**
 * Copies the image's repository into the workspace and makes its current state the base: a repository without
 * git gets one, uncommitted changes in the image are committed, bytecode and caches are ignored (so the agent
 * running the tests does not put .pyc files into its diff). Exit 3: no such directory; 4: no git in the image.
 */
const PREPARE = `set -eu
src=$1 dst=$2
[ -d "$src" ] || { echo "the image has no directory $src" >&2; exit 3; }
command -v git >/dev/null 2>&1 || { echo "git is not installed in the image" >&2; exit 4; }
rm -rf -- "$dst"
cp -R --preserve=mode,timestamps,links --no-preserve=ownership -- "$src" "$dst"
cd "$dst"
if [ "$(git rev-parse --show-toplevel 2>/dev/null || true)" != "$(pwd -P)" ]; then
  rm -rf .git
  git init -q .
fi
mkdir -p .git/info
printf '%s\\n' '__pycache__/' '*.py[cod]' '.pytest_cache/' >> .git/info/exclude
git add -A
if ! git rev-parse -q --verify HEAD >/dev/null || [ -n "$(git status --porcelain)" ]; then
  git ${GIT_IDENTITY} commit -q --no-verify --allow-empty -m "rollout: the image's state"
fi
git update-ref ${BASE_REF} HEAD
`;

/**
 * The agent's changes as a binary-safe git diff written to $3: the working copy $2 (its files, with \`git add -A\`)
 * against its base ref (commits the agent made included). That git directory is the agent's, though: when it is gone
 * or broken (\`rm -rf .git\`, a deleted base ref, a corrupt index), both trees are read instead with a scratch git
 * directory — the working copy's against the image's repository $1, which the agent cannot touch — so the agent's
 * doing never stops the eval. Exit 5: the working copy itself could not be read (deleted, unreadable files), the
 * agent's doing too.
 */
const DIFF = `set -eu
src=$1 dst=$2 out=$3
own_git() (cd "$dst" && base=$(git rev-parse -q --verify ${BASE_REF}) && git add -A && git diff --cached --binary --no-color --no-ext-diff --no-renames "$base" > "$out")
scratch_git() (
  scratch=$(mktemp -d)
  trap 'rm -rf -- "$scratch"' EXIT
  git init -q "$scratch/repo"
  export GIT_DIR="$scratch/repo/.git"
  printf '%s\\n' '__pycache__/' '*.py[cod]' '.pytest_cache/' >> "$GIT_DIR/info/exclude"
  tree() { (cd "$1" && export GIT_INDEX_FILE="$scratch/index-$2" && git --work-tree=. add -A && git --work-tree=. write-tree); }
  base=$(tree "$src" base)
  mine=$(tree "$dst" agent 2>"$scratch/error") || { cat -- "$scratch/error" >&2; exit 5; }
  git diff --binary --no-color --no-ext-diff --no-textconv --no-renames "$base" "$mine" > "$out"
)
own_git 2>/dev/null || scratch_git
`;

/**
 * Applies the patch in $2 to the copy at $1: \`git apply\`, then \`patch --fuzz=5\` (as SWE-bench's harness) on a
 * clean tree if git refuses. Exit 0 applied; 1 not applied (output says why).
 */
const APPLY = `set -u
cd "$1"
[ -s "$2" ] || exit 0
out=$(git apply --binary --whitespace=nowarn "$2" 2>&1) && exit 0
if command -v patch >/dev/null 2>&1; then
  git checkout -q -- . 2>/dev/null; git clean -fdq 2>/dev/null
  out2=$(patch --batch --fuzz=5 -p1 --forward -i "$2" 2>&1) && exit 0
  git checkout -q -- . 2>/dev/null; git clean -fdq 2>/dev/null
  out="$out
patch: $out2"
fi
printf '%s\\n' "$out"
exit 1
`;

/**
 * Resets the files the test patch touches to the base (deleting those the base lacks), then applies it ($2), as
 * SWE-bench's harness does, so an agent that edited the tests cannot keep the new ones from applying. When it still
 * does not apply, whose fault that is: exit 5 when it applies to the base alone (checked on a scratch index of the
 * base: the agent's patch is in the way, e.g. a file where the test patch makes a directory), 1 when it does not.
 */
const APPLY_TESTS = `set -u
cd "$1" || exit 1
patch_file=$2
shift 2
for f in "$@"; do
  if git cat-file -e "${BASE_REF}:$f" 2>/dev/null; then git checkout -q ${BASE_REF} -- "$f"; else rm -rf -- "$f"; fi
done
out=$(git apply --binary --whitespace=nowarn "$patch_file" 2>&1) && exit 0
index=$(mktemp) || exit 1
if GIT_INDEX_FILE=$index git read-tree ${BASE_REF} && GIT_INDEX_FILE=$index git apply --cached --check --binary "$patch_file" 2>/dev/null; then status=5; else status=1; fi
rm -f -- "$index"
printf '%s\\n' "$out"
exit $status
`;

/**
 * Runs the test command ($4, evaluated by bash at the copy's root) with the report plugin on PYTHONPATH and in
 * PYTEST_ADDOPTS; output to $5. Exit status: the command's.
 */
const RUN_TESTS = `cd "$1" || exit 125
export ROLLOUT_SWE_REPORT="$2"
export PYTHONPATH="$3\${PYTHONPATH:+:$PYTHONPATH}"
export PYTEST_ADDOPTS="-p rollout_swe_report \${PYTEST_ADDOPTS:-}"
export PYTHONDONTWRITEBYTECODE=1
command=$4 output=$5
shift 5
eval "$command" > "$output" 2>&1
`;

export interface RunOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
}

function bash(sandbox: Sandbox, script: string, args: readonly string[], options: RunOptions): Promise<ExecResult> {
  return sandbox.exec(['bash', '-c', script, 'rollout-swe', ...args], { signal: options.signal, timeoutMs: options.timeoutMs, cwd: sandbox.workdir });
}

function failure(what: string, result: ExecResult): RolloutError {
  const why = result.timedOut ? 'timed out' : result.exitCode === null ? `killed by ${result.signal}` : `exit code ${result.exitCode}`;
  const output = `${result.stderr}${result.stdout}`.trim().slice(-1500);
  return new RolloutError('environment_error', `${what} failed (${why})${output ? `: ${output}` : ''}`);
}

/** Copies the image's repository into the workspace and marks the base; returns the copy's path. */
export async function prepareWorkingCopy(sandbox: Sandbox, repoPath: string, options: RunOptions = {}): Promise<string> {
  const dst = workingCopyPath(sandbox, repoPath);
  const result = await bash(sandbox, PREPARE, [repoPath, dst], options);
  if (result.exitCode !== 0) throw failure(`copying the repository ${repoPath} to ${dst}`, result);
  return dst;
}

/** Why the agent's working copy could not be read: what the agent did to it, not an infrastructure failure. */
export class UnreadableWorkingCopy extends Error {}

/**
 * The agent's diff of the working copy `dir` against the image's repository `repoPath`, read back from the sandbox;
 * `maxBytes` bounds what is read. Throws {@link UnreadableWorkingCopy} when the agent left the working copy unreadable
 * (deleted, files without read permission), environment_error when the diff fails otherwise.
 */
export async function diffWorkingCopy(sandbox: Sandbox, repoPath: string, dir: string, maxBytes: number, options: RunOptions = {}): Promise<{ patch: string; bytes: number }> {
  const file = `${SCRATCH_DIR}/agent.patch`;
  const result = await bash(sandbox, `mkdir -p ${SCRATCH_DIR}\n${DIFF}\nwc -c < "$3"`, [repoPath, dir, file], options);
  if (result.exitCode === 5) throw new UnreadableWorkingCopy(`the working copy ${dir} could not be read: ${result.stderr.trim().slice(-1500)}`);
  if (result.exitCode !== 0) throw failure(`taking the diff of ${dir}`, result);
  const bytes = Number(result.stdout.trim());
  if (bytes > maxBytes) return { patch: '', bytes };
  return { patch: bytes === 0 ? '' : await sandbox.readFile(file, { signal: options.signal, maxBytes }), bytes };
}

/** Applies `patch` to the copy at `dir`; `{ applied: false, reason }` when neither git nor patch could. */
export async function applyPatch(sandbox: Sandbox, dir: string, patch: string, options: RunOptions = {}): Promise<{ applied: boolean; reason: string }> {
  const file = `${SCRATCH_DIR}/agent.patch`;
  await sandbox.writeFile(file, patch, { signal: options.signal });
  const result = await bash(sandbox, APPLY, [dir, file], options);
  if (result.exitCode === 0) return { applied: true, reason: '' };
  if (result.exitCode !== 1) throw failure('applying the patch', result);
  return { applied: false, reason: result.stdout.trim().slice(-2000) };
}

/**
 * Resets the files `paths` to the base and applies the test patch. `{ applied: false, reason }` when it applies to the
 * base but not on top of the agent's patch (the agent's doing); throws environment_error when it does not apply to the
 * base either (the instance's fault) or the script fails otherwise.
 */
export async function applyTestPatch(sandbox: Sandbox, dir: string, testPatch: string, paths: readonly string[], options: RunOptions = {}): Promise<{ applied: boolean; reason: string }> {
  const file = `${SCRATCH_DIR}/test.patch`;
  await sandbox.writeFile(file, testPatch, { signal: options.signal });
  const result = await bash(sandbox, APPLY_TESTS, [dir, file, ...paths], options);
  if (result.exitCode === 0) return { applied: true, reason: '' };
  if (result.exitCode === 5) return { applied: false, reason: result.stdout.trim().slice(-2000) };
  throw failure("applying the instance's test_patch to the base", result);
}

/** The largest pytest report read back (a real one is a few KB per test). */
const REPORT_MAX_BYTES = 64 << 20;

export interface TestRun {
  result: ExecResult;
  /** The plugin was imported: pytest started. */
  started: boolean;
  /** The plugin's JSON, when pytest finished its session. */
  report: string | undefined;
  /**
   * Why a report file that is there could not be read (larger than REPORT_MAX_BYTES): the code under test can write
   * it (it runs as the same user), so this is the attempt's doing, not the environment's.
   */
  reportProblem?: string;
  /** The last bytes of the test command's output. */
  outputTail: string;
}

/** Runs the test command with the report plugin (its source written to the scratch dir first). */
export async function runTests(sandbox: Sandbox, dir: string, command: string, plugin: { module: string; source: string }, options: RunOptions = {}): Promise<TestRun> {
  const pluginDir = `${SCRATCH_DIR}/plugin`;
  const report = `${SCRATCH_DIR}/report.json`;
  const output = `${SCRATCH_DIR}/test-output.txt`;
  await sandbox.writeFile(`${pluginDir}/${plugin.module}.py`, plugin.source, { signal: options.signal });
  const result = await bash(sandbox, RUN_TESTS, [dir, report, pluginDir, command, output], options);
  const probe = await bash(
    sandbox,
    'test -e "$1.started" && echo started; test -f "$1" && echo report; tail -c 8192 "$2" 2>/dev/null || true',
    [report, output],
    { signal: options.signal },
  );
  const [first = '', second = ''] = probe.stdout.split('\n');
  const started = first === 'started';
  const hasReport = (started ? second : first) === 'report';
  const outputTail = probe.stdout.split('\n').slice(Number(started) + Number(hasReport)).join('\n');
  let text: string | undefined;
  let reportProblem: string | undefined;
  if (hasReport) {
    try {
      text = await sandbox.readFile(report, { signal: options.signal, maxBytes: REPORT_MAX_BYTES });
    } catch (err) {
      // Over the bound (readFile says invalid_argument naming its path): anything else (the sandbox died) is the
      // infrastructure's and propagates.
      if (!(err instanceof RolloutError) || err.code !== 'invalid_argument') throw err;
      reportProblem = `the report file is over ${REPORT_MAX_BYTES >> 20} MiB`;
    }
  }
  return { result, started, report: text, ...(reportProblem !== undefined && { reportProblem }), outputTail };
}
