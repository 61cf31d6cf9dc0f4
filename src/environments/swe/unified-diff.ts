/**
 * Just enough of the unified diff format (`git diff`, `diff -u`) to know which files a patch touches and what each
 * hunk replaces. Applying patches is left to `git apply` / `patch` inside the sandbox; this reader never applies
 * anything, so a patch it misreads can only give a wrong file list (test files reset before the test patch) or a
 * wrong scripted edit (tests), never a wrong evaluation of the agent's code.
 */

/** One hunk: the text it expects (context and removed lines) and the text it leaves (context and added lines). */
export interface DiffHunk {
  /** Line in the old file where the hunk starts (1-based, from the `@@ -l,s` header). */
  oldStart: number;
  oldText: string;
  newText: string;
}

/** One file of a patch. Paths are as in the patch with the a/ and b/ prefixes removed; /dev/null stays as is. */
export interface DiffFile {
  oldPath: string;
  newPath: string;
  hunks: DiffHunk[];
}

const HUNK_HEADER = /^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@/;

/**
 * Parses a unified diff into files and hunks. Lines outside files (a commit message, `diff --git`, `index`) are
 * skipped; "\ No newline at end of file" drops the newline of the line before it. Binary diffs yield a file with no
 * hunks (paths from the `diff --git` line). Throws Error naming the line on a hunk that ends early.
 */
export function parseUnifiedDiff(patch: string): DiffFile[] {
  const lines = patch.split('\n');
  const files: DiffFile[] = [];
  let current: DiffFile | undefined;
  let awaitingNames = false;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    const git = /^diff --git a\/(.+) b\/(.+)$/.exec(line);
    if (git) {
      current = { oldPath: git[1]!, newPath: git[2]!, hunks: [] };
      files.push(current);
      awaitingNames = true;
      continue;
    }
    if (line.startsWith('--- ') && lines[i + 1]?.startsWith('+++ ')) {
      const oldPath = stripPrefix(pathOf(line.slice(4)), 'a/');
      const newPath = stripPrefix(pathOf(lines[i + 1]!.slice(4)), 'b/');
      // After `diff --git` the ---/+++ pair names the same file (and says /dev/null for an added or deleted one).
      if (current && awaitingNames) Object.assign(current, { oldPath, newPath });
      else files.push((current = { oldPath, newPath, hunks: [] }));
      awaitingNames = false;
      i++;
      continue;
    }
    const header = HUNK_HEADER.exec(line);
    if (!header || !current) continue;
    awaitingNames = false;
    let oldLeft = header[2] === undefined ? 1 : Number(header[2]);
    let newLeft = header[4] === undefined ? 1 : Number(header[4]);
    const oldLines: string[] = [];
    const newLines: string[] = [];
    let last: 'old' | 'new' | 'both' = 'both';
    while (oldLeft > 0 || newLeft > 0) {
      i++;
      if (i >= lines.length) throw new Error(`patch ends inside the hunk at line ${Number(header[1])} of ${current.oldPath}`);
      const body = lines[i]!;
      const text = body.slice(1);
      if (body.startsWith('\\')) {
        dropNewline(last === 'new' ? [newLines] : last === 'old' ? [oldLines] : [oldLines, newLines]);
        continue;
      }
      if (body.startsWith('-')) {
        oldLines.push(`${text}\n`);
        oldLeft--;
        last = 'old';
      } else if (body.startsWith('+')) {
        newLines.push(`${text}\n`);
        newLeft--;
        last = 'new';
      } else if (body.startsWith(' ') || body === '') {
        oldLines.push(`${text}\n`);
        newLines.push(`${text}\n`);
        oldLeft--;
        newLeft--;
        last = 'both';
      } else {
        throw new Error(`unexpected line in the hunk at line ${Number(header[1])} of ${current.oldPath}: ${JSON.stringify(body.slice(0, 80))}`);
      }
    }
    if (lines[i + 1]?.startsWith('\\')) {
      dropNewline(last === 'new' ? [newLines] : last === 'old' ? [oldLines] : [oldLines, newLines]);
      i++;
    }
    current.hunks.push({ oldStart: Number(header[1]), oldText: oldLines.join(''), newText: newLines.join('') });
  }
  return files;
}

/** Every path a patch reads or writes (old and new names, without /dev/null), in order, once each. */
export function touchedPaths(patch: string): string[] {
  const paths = parseUnifiedDiff(patch).flatMap((f) => [f.oldPath, f.newPath]);
  return [...new Set(paths.filter((p) => p !== '/dev/null'))];
}

function pathOf(header: string): string {
  // `--- a/x.py\t2024-01-01 ...` (diff -u puts a timestamp after a tab); git quotes unusual names.
  const name = header.split('\t')[0]!.trimEnd();
  if (name.startsWith('"') && name.endsWith('"')) return JSON.parse(name) as string;
  return name;
}

function stripPrefix(path: string, prefix: string): string {
  return path.startsWith(prefix) ? path.slice(prefix.length) : path;
}

function dropNewline(targets: string[][]): void {
  for (const lines of targets) {
    const lastLine = lines.at(-1);
    if (lastLine !== undefined) lines[lines.length - 1] = lastLine.replace(/\n$/, '');
  }
}
