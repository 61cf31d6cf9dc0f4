import { posix } from 'node:path';
import { PYTEST_DEPENDENCY_MODULES, STDLIB_MODULES } from './stdlib-modules.js';
import { RolloutError } from '../../errors.js';
import type { ExecResult, Sandbox } from '../../sandboxes/types.js';
import { PYTEST_PLUGIN_MODULE } from './grading.js';

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

/** Seconds each git command of the working copy's own git may take before the scratch git directory is used instead. */
const OWN_GIT_SECONDS = 20;

/**
 * The agent's changes as a binary-safe git diff written to $3: the working copy $2 (its files, with \`git add -A\`)
 * against its base ref (commits the agent made included). That git directory is the agent's, though: when it is gone
 * or broken (\`rm -rf .git\`, a deleted base ref, a corrupt index), both trees are read instead with a scratch git
 * directory — the working copy's against the image's repository $1, which the agent cannot touch — so the agent's
 * doing never stops the eval. Exit 5: the working copy itself could not be read (deleted, unreadable files), the
 * agent's doing too.
 *
 * The agent wrote HOME (its workspace) and the working copy's .git/config too: a ~/.gitconfig git cannot parse failed
 * both ways, a clean filter or an fsmonitor hook that never returns hung them (an environment_error, or the eval's
 * TIMEOUT: trainers drop both). So git runs with a HOME of its own (no global configuration: the image's system one
 * only), the working copy's git is bounded in time (then the scratch git directory, whose configuration is fresh,
 * takes the diff) and told to use no fsmonitor.
 */
const DIFF = `set -eu
src=$1 dst=$2 out=$3
export HOME="$scratch_dir"
unset XDG_CONFIG_HOME GIT_CONFIG_GLOBAL
bounded() { if command -v timeout >/dev/null 2>&1; then timeout -s KILL ${OWN_GIT_SECONDS} "$@"; else "$@"; fi; }
own_git() (cd "$dst" && base=$(bounded git rev-parse -q --verify ${BASE_REF}) && bounded git -c core.fsmonitor=false add -A && bounded git -c core.fsmonitor=false diff --cached --binary --no-color --no-ext-diff --no-textconv --no-renames "$base" > "$out")
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
 * clean tree if git refuses. patch(1) writes wherever the patch says, .git included (git apply refuses that): a
 * .git/commondir made git fail in the eval, and a nested sub/.git hides the files under it from git's lists, so the
 * reset of the test infrastructure never saw them. The copy's .git is moved aside under a name the patch cannot know
 * while patch(1) runs, and a patch that made any .git is not applied. Exit 0 applied; 1 not applied (output says why).
 */
const APPLY = `set -u
cd "$1"
[ -s "$2" ] || exit 0
out=$(git apply --binary --whitespace=nowarn "$2" 2>&1) && exit 0
if command -v patch >/dev/null 2>&1; then
  git checkout -q -- . 2>/dev/null; git clean -fdq 2>/dev/null
  aside=.git-rollout-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \\n')
  mv .git "$aside" || exit 2
  out2=$(patch --batch --fuzz=5 -p1 --forward -i "$2" 2>&1)
  status=$?
  made=$(find . -path "./$aside" -prune -o -name .git -print -quit)
  if [ -n "$made" ]; then
    status=1 out2="the patch writes into a .git ($made), which is not part of the repository's files"
    find . -path "./$aside" -prune -o -name .git -prune -exec rm -rf -- {} +
  fi
  mv "$aside" .git || exit 2
  [ "$status" = 0 ] && exit 0
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
  if git cat-file -e "${BASE_REF}:$f" 2>/dev/null; then git -c core.hooksPath=/dev/null checkout -q ${BASE_REF} -- "$f"; else rm -rf -- "$f"; fi
done
out=$(git apply --binary --whitespace=nowarn "$patch_file" 2>&1) && exit 0
index=$(mktemp) || exit 1
if GIT_INDEX_FILE=$index git read-tree ${BASE_REF} && GIT_INDEX_FILE=$index git apply --cached --check --binary "$patch_file" 2>/dev/null; then status=5; else status=1; fi
rm -f -- "$index"
printf '%s\\n' "$out"
exit $status
`;

/**
 * Test infrastructure, as bash \`case\` patterns on "/<path>": what pytest and Python read before or around the tests
 * and a patch could use to report results instead of earning them. conftest.py files (hooks that rewrite outcomes or the
 * report), pytest's configuration files at any depth (pytest 9 reads pytest.toml and .pytest.toml too; inifile discovery starts at the test files' directory; \`addopts\`
 * can load a plugin of the patch), sitecustomize / usercustomize and .pth files (run at interpreter start-up, before
 * the report plugin), *.dist-info / *.egg-info (a pytest11 entry point is loaded as a plugin), and modules at the root
 * that would shadow pytest itself when it runs as \`python -m pytest\` from there; a module named as the report plugin at
 * any depth (\`python -m pytest\` puts the root, a command's \`PYTHONPATH=src:...\` its directory, before the plugin's: it
 * would be imported instead, read the nonce and report what it likes). Each directory pattern also matches the
 * directory's own name: a link named \`x.dist-info\` or \`pytest\` to a directory of the patch is listed by that name.
 * Bytecode too (\`__pycache__\`, *.pyc): pytest's assertion rewriter loads a test file's cached bytecode whenever its
 * recorded mtime and size are the source's, and the copy keeps the image's mtimes: the test, rewritten, with the
 * file itself untouched.
 */
export const TEST_INFRASTRUCTURE = [
  '*/conftest.py',
  '*/pytest.ini',
  '*/.pytest.ini',
  '*/pytest.toml',
  '*/.pytest.toml',
  '*/pyproject.toml',
  '*/tox.ini',
  '*/setup.cfg',
  '*/sitecustomize.py',
  '*/usercustomize.py',
  '*.pth',
  '*.dist-info',
  '*.dist-info/*',
  '*.egg-info',
  '*.egg-info/*',
  '/pytest.py',
  '/pytest',
  '/pytest/*',
  '/_pytest',
  '/_pytest/*',
  '/pluggy',
  '/pluggy/*',
  '/py.py',
  '*/__pycache__',
  '*/__pycache__/*',
  '*.py[co]',
  `*/${PYTEST_PLUGIN_MODULE}`,
  `*/${PYTEST_PLUGIN_MODULE}.*`,
  `*/${PYTEST_PLUGIN_MODULE}/*`,
];

/**
 * Restores the test infrastructure the agent's patch changed to the image's state ($1 the image's repository, $2 the
 * working copy): files pytest or Python read before or around the tests, whose change lets a patch forge results
 * instead of fixing the code (see {@link TEST_INFRASTRUCTURE}). What the image has is copied back, what it lacks is
 * deleted; so are the test files named on stdin (NUL-separated: the files of the listed tests and those the test patch
 * touches) and, after an empty record, everything under the test trees named there (see {@link testTrees}). Changed means: tracked and different from the base, or untracked (ignored ones included: a patch may add
 * a .gitignore) and not the image's own file. The restored paths go NUL-separated to $3, their count to stdout.
 *
 * Every name in the working copy is the patch's: the lists are read whole before anything runs (an empty record
 * ends them, so a failing git is an error, not an empty list), nothing reads the names' stdin (a link to
 * /proc/self/fd/0 made cmp swallow the names after it), only regular files are compared (never through a link), and a
 * parent directory the patch made a link or a file is removed before anything is written through it. Exit 1: git could
 * not list the changes (the environment's); 6: a path could not be put back (the working copy's state: the patch's).
 */
const RESET_TEST_INFRASTRUCTURE = `set -u
src=$1 out=$3
cd "$2" || exit 1
: > "$out"
declare -A tests=()
trees=() section=
while IFS= read -r -d '' f; do if [ -z "$f" ]; then section=trees; elif [ -z "$section" ]; then tests["$f"]=1; else trees+=("$f"); fi; done
declare -A stdlib=(${[...STDLIB_MODULES, ...PYTEST_DEPENDENCY_MODULES].map((name) => `[${name}]=1`).join(' ')})
names=() listed=
while IFS= read -r -d '' f; do if [ -n "$f" ]; then names+=("$f"); else listed=1; fi; done < <(git diff --name-only -z --no-renames ${BASE_REF} -- && git ls-files --others -z && printf '\\0')
[ -n "$listed" ] || { echo "git could not list the working copy's changes" >&2; exit 1; }
count=0 gone=()
restored() { printf '%s\\0' "$1" >> "$out"; count=$((count + 1)); }
regular() { [ -f "$1" ] && [ ! -L "$1" ]; }
for f in "\${names[@]}"; do
  case "/$f" in
    ${TEST_INFRASTRUCTURE.join('|')}) ;;
    *)
      intree=
      for t in \${trees[@]+"\${trees[@]}"}; do [[ $f == "$t"/* ]] && { intree=1; break; }; done
      if [ -z "\${tests["$f"]+set}" ] && [ -z "$intree" ]; then
        # A module the patch added at the root under a standard-library name (or one of pytest's dependencies): \`python -m pytest\` puts the root first on
        # sys.path, so it runs before any plugin (it could take the nonce). One the image has is the repository's own.
        top=\${f%%/*} mod=\${top%%.*}
        [[ $mod =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] && [ -n "\${stdlib[$mod]+set}" ] && [ ! -e "$src/$top" ] && [ ! -L "$src/$top" ] || continue
      fi ;;
  esac
  rest=$f parent=
  while [[ $rest == */* ]]; do
    parent=\${parent:+$parent/}\${rest%%/*} rest=\${rest#*/}
    if [ -L "$parent" ] || { [ -e "$parent" ] && [ ! -d "$parent" ]; }; then
      rm -f -- "$parent" || { echo "cannot remove $parent" >&2; exit 6; }
      restored "$parent"
    fi
  done
  if [ -e "$src/$f" ] || [ -L "$src/$f" ]; then
    regular "$f" && regular "$src/$f" && cmp -s -- "$src/$f" "$f" < /dev/null && continue
    { rm -rf -- "$f" && mkdir -p -- "$(dirname -- "$f")" && cp -RP --preserve=mode,timestamps,links -- "$src/$f" "$f"; } < /dev/null || { echo "cannot put back $f" >&2; exit 6; }
  else
    [ -e "$f" ] || [ -L "$f" ] || continue
    gone+=("$f")
  fi
  restored "$f"
done
# What the image lacks is removed at once: one rm per file made a patch of 20,000 conftest.py files outlast the
# command's time (an ENVIRONMENT_ERROR the trainer drops).
[ "\${#gone[@]}" -eq 0 ] || printf '%s\\0' "\${gone[@]}" | xargs -0 rm -rf -- || { echo "cannot remove what the patch added" >&2; exit 6; }
echo "$count"
`;

export interface RunOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
}

/** Runs `script` by bash in the sandbox, `args` as its positional parameters (never interpolated into it). */
export function bash(sandbox: Sandbox, script: string, args: readonly string[], options: RunOptions): Promise<ExecResult> {
  return sandbox.exec(['bash', '-c', script, 'rollout-swe', ...args], { signal: options.signal, timeoutMs: options.timeoutMs, cwd: sandbox.workdir });
}

/** An environment_error saying which step failed, how, and the end of its output. */
export function failure(what: string, result: ExecResult): RolloutError {
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

/** Why the agent's working copy could not be read (or diffed): what the agent did to it or its sandbox, not an infrastructure failure. */
export class UnreadableWorkingCopy extends Error {}

/**
 * The agent's diff of the working copy `dir` against the image's repository `repoPath`, read back from the sandbox;
 * `maxBytes` bounds what is read. Throws {@link UnreadableWorkingCopy} when the agent left the working copy unreadable
 * (deleted, files without read permission) or its sandbox without room to take the diff (a full /tmp or workspace),
 * environment_error when the diff fails otherwise.
 */
export async function diffWorkingCopy(sandbox: Sandbox, repoPath: string, dir: string, maxBytes: number, options: RunOptions = {}): Promise<{ patch: string; bytes: number }> {
  // This runs in the agent's own sandbox, whose files the agent wrote: a fixed scratch path could hold what it put
  // there (a FIFO that blocks the write until the timeout, a file where the directory goes, a symlink to /dev/full),
  // and the eval would fail as environment_error, which trainers drop. So the diff goes to a fresh directory (mktemp:
  // a name nothing could know beforehand), whose path the script prints before the diff's size.
  const result = await bash(sandbox, `(\n${DIFF_SCRATCH}\n${DIFF}\nprintf '%s\\n' "$3"\nwc -c < "$3"\n)\n${DIFF_ROOM}`, [repoPath, dir], options);
  if (result.exitCode === 5) throw new UnreadableWorkingCopy(`the working copy ${dir} could not be read: ${result.stderr.trim().slice(-1500)}`);
  if (result.exitCode === 6) throw new UnreadableWorkingCopy(`the diff of ${dir} could not be taken: ${result.stderr.trim().slice(-1500)}`);
  if (result.exitCode !== 0) throw failure(`taking the diff of ${dir}`, result);
  const [file = '', size = ''] = result.stdout.trim().split('\n');
  const bytes = Number(size);
  if (!file.startsWith('/') || !Number.isInteger(bytes)) throw failure(`taking the diff of ${dir} (unexpected output)`, result);
  if (bytes > maxBytes) return { patch: '', bytes };
  return { patch: bytes === 0 ? '' : await sandbox.readFile(file, { signal: options.signal, maxBytes }), bytes };
}

/**
 * After the diff script (in a subshell before it) failed otherwise than exit 5: exit 6 when the agent's sandbox has no
 * room left in $TMPDIR or the workspace holding the working copy $2 (64 KiB cannot be written there). Both are the
 * agent's alone, and filling them (\`head -c 2G /dev/zero > /tmp/x\`) made the diff an environment_error, which
 * trainers drop: the agent's doing, reward 0 with the reason.
 */
const DIFF_ROOM = `status=$?
case $status in 0|5) exit $status ;; esac
room() { probe="$1/.rollout-swe-room.$$"; head -c 65536 /dev/zero 2>/dev/null > "$probe"; r=$?; rm -f -- "$probe"; return $r; }
room "\${TMPDIR:-/tmp}" && room "$(dirname -- "$2")" && exit $status
echo "the agent's sandbox has no room left (its /tmp or workspace is full: 64 KiB cannot be written)" >&2
exit 6`;

/** Sets $3 to the diff's file in a directory of its own (see diffWorkingCopy), under $TMPDIR or /tmp. */
const DIFF_SCRATCH = `scratch_dir=$(mktemp -d "\${TMPDIR:-/tmp}/rollout-swe-diff.XXXXXXXXXX") || exit 1
set -- "$1" "$2" "$scratch_dir/agent.patch"`;

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

/**
 * The test trees of `testFiles`: for each, the directory up to its deepest path component named `test` or `tests`
 * (`tests/unit/test_x.py` → `tests`, `pkg/tests/test_x.py` → `pkg/tests`; `pkg/test_x.py`, beside the code, has
 * none). A listed test imports and reads what lies there - helper modules, fixtures' data, expected outputs - so a
 * patch that edited `tests/helpers.py` could make a listed test pass without fixing anything; a fix has no business
 * there (the instance's test_patch brings the tests; SWE-bench's own split puts what lies in test directories into
 * the test patch, never the gold patch). `testing` is not one: numpy.testing is library code.
 */
export function testTrees(testFiles: readonly string[]): string[] {
  const trees = new Set<string>();
  for (const file of testFiles) {
    const dirs = file.split('/').slice(0, -1);
    const last = Math.max(dirs.lastIndexOf('test'), dirs.lastIndexOf('tests'));
    if (last >= 0) trees.add(dirs.slice(0, last + 1).join('/'));
  }
  return [...trees].sort();
}

/**
 * Restores the test infrastructure ({@link TEST_INFRASTRUCTURE}), the `testFiles` (repository-relative paths) and
 * everything under their {@link testTrees} the agent's patch changed in the copy at `dir` to the image's repository `repoPath`; returns the restored paths (at most
 * `REPORT_RESET_PATHS` read back, `count` says all). `problem` says why a path could not be put back: the image's files
 * were copied into this workspace once already, so that is the state the patch left (e.g. a full disk), the patch's doing.
 */
export async function resetTestInfrastructure(
  sandbox: Sandbox,
  repoPath: string,
  dir: string,
  testFiles: readonly string[],
  options: RunOptions = {},
): Promise<{ paths: string[]; count: number; problem?: string }> {
  const file = `${SCRATCH_DIR}/reset-paths`;
  const stdin = [...testFiles, '', ...testTrees(testFiles)].map((f) => `${f}\0`).join('');
  const result = await sandbox.exec(['bash', '-c', `mkdir -p ${SCRATCH_DIR}\n${RESET_TEST_INFRASTRUCTURE}`, 'rollout-swe', repoPath, dir, file], { signal: options.signal, timeoutMs: options.timeoutMs, cwd: sandbox.workdir, stdin });
  if (result.exitCode === 6) return { paths: [], count: 0, problem: result.stderr.trim().slice(-1500) };
  if (result.exitCode !== 0) throw failure("restoring the repository's test infrastructure", result);
  const count = Number(result.stdout.trim());
  if (count === 0) return { paths: [], count };
  // Bounded: a patch may add a great many such files; the report names the first ones.
  const text = await sandbox.readFile(file, { signal: options.signal, maxBytes: 1 << 20 }).catch((err: unknown) => {
    if (err instanceof RolloutError && err.code === 'invalid_argument') return '';
    throw err;
  });
  return { paths: text.split('\0').filter((p) => p !== '').slice(0, REPORT_RESET_PATHS), count };
}

/**
 * Lists, NUL-separated into $2, what differs in the copy $1 from its base (tracked and changed, or untracked, ignored
 * ones included): after the reset of the test infrastructure and before the test patch, that is the agent's patch.
 */
const LIST_PATCHED = `set -u
cd "$1" || exit 1
{ git diff --name-only -z --no-renames ${BASE_REF} -- && git ls-files --others -z; } > "$2"
`;

/**
 * Writes the list of the files the agent's patch left changed in the copy at `dir` (call it after
 * {@link resetTestInfrastructure}, before the test patch) to a scratch file, for the report plugin; returns its path.
 * git failing to list them is the environment's (as in the reset, which lists the same just before).
 */
export async function listPatchedPaths(sandbox: Sandbox, dir: string, options: RunOptions = {}): Promise<string> {
  const file = `${SCRATCH_DIR}/patched-paths`;
  const result = await bash(sandbox, `mkdir -p ${SCRATCH_DIR}\n${LIST_PATCHED}`, [dir, file], options);
  if (result.exitCode !== 0) throw failure("listing the files the patch changed", result);
  return file;
}

/**
 * Lists, NUL-separated into $2, the test sources of the copy $1: the files named after it up to an argument `--trees`
 * (the listed tests' files and the test patch's) that exist, every file under the test trees named after it, and every
 * conftest.py.
 */
const LIST_PROTECTED = `set -u
cd "$1" || exit 1
out=$2
shift 2
{
  while [ $# -gt 0 ] && [ "$1" != --trees ]; do [ -f "$1" ] && printf '%s\\0' "$1"; shift; done
  [ $# -gt 0 ] && shift
  for t in "$@"; do [ -d "$t" ] && ! [ -L "$t" ] && find "$t" -name .git -prune -o -type f -print0; done
  find . -name .git -prune -o -type f -name conftest.py -printf '%P\\0'
} > "$out"
`;

/**
 * Writes the list of the test sources of the copy at `dir` (`testFiles`, the files under their {@link testTrees}, every
 * conftest.py) to a scratch file, for the report plugin, which reports those changed while pytest ran; returns its path.
 */
export async function listProtectedPaths(sandbox: Sandbox, dir: string, testFiles: readonly string[], options: RunOptions = {}): Promise<string> {
  const file = `${SCRATCH_DIR}/protected-paths`;
  const result = await bash(sandbox, `mkdir -p ${SCRATCH_DIR}\n${LIST_PROTECTED}`, [dir, file, ...testFiles, '--trees', ...testTrees(testFiles)], options);
  if (result.exitCode !== 0) throw failure('listing the test sources', result);
  return file;
}

/** Restored paths the report names one by one. */
const REPORT_RESET_PATHS = 100;
