import { posix } from 'node:path';
import { z } from 'zod';
import { RolloutError } from '../errors.js';
import type { DirEntry, Sandbox } from '../sandboxes/types.js';
import { defineTool, type ValidatedTool } from './define-tool.js';
import { fileLimitProblem } from './file-limit.js';
import { countLines, insertAfterLine, linesBetween, numberLines, replaceUnique } from './text-edit.js';
import type { ToolResult } from './types.js';

/** Lines one `view` shows at most; the note says how to see the rest. */
const VIEW_LINES = 300;
/** Characters of one `view` observation at most, of a file (long lines are cut first) or of a directory listing. */
const VIEW_CHARS = 20_000;
/** Entries of a directory listing at most. */
const LIST_ENTRIES = 200;
/** Versions kept per file for undo_edit. */
const UNDO_DEPTH = 5;
/**
 * Characters of earlier versions kept per sandbox for undo_edit, all files together (a larger file's version is not
 * kept): they live in the server's memory, once per sample in flight, so they are bounded per sample, not per file.
 */
const UNDO_BUDGET_CHARS = 1 << 20;
/** Longest path accepted: Linux's PATH_MAX. A path is an argument of the file scripts, and past 128 KiB no process can start. */
const MAX_PATH_CHARS = 4096;

const args = z
  .object({
    command: z.enum(['view', 'create', 'str_replace', 'insert', 'undo_edit']).describe('The operation.'),
    path: z.string().min(1).describe('File or directory path; relative paths are relative to the workspace.'),
    file_text: z.string().optional().describe('create: the content of the new file.'),
    old_str: z.string().optional().describe('str_replace: the exact text to replace; it must occur exactly once in the file.'),
    new_str: z.string().optional().describe('str_replace: the replacement (may be empty). insert: the text to insert.'),
    insert_line: z.number().int().min(0).optional().describe('insert: the line after which to insert (0 inserts at the top).'),
    view_range: z.array(z.number().int()).length(2).optional().describe('view: [first, last] line numbers, 1-based; last -1 means to the end.'),
  })
  .superRefine((a, ctx) => {
    if (a.path.length > MAX_PATH_CHARS) ctx.addIssue({ code: 'custom', path: ['path'], message: `is longer than ${MAX_PATH_CHARS} characters` });
    const need = (field: keyof typeof a, why: string): void => {
      if (a[field] === undefined) ctx.addIssue({ code: 'custom', path: [field], message: `required for command "${a.command}" (${why})` });
    };
    if (a.command === 'create') need('file_text', 'the content of the new file');
    if (a.command === 'str_replace') need('old_str', 'the text to replace');
    if (a.command === 'insert') {
      need('insert_line', 'where to insert');
      need('new_str', 'the text to insert');
    }
  });

type Args = z.output<typeof args>;

/**
 * The file editor, one tool named `str_replace_editor` with a `command` argument (view, create, str_replace,
 * insert, undo_edit) and the argument names of SWE-agent's and OpenHands' tool of that name.
 *
 * Why one tool and not five: models fine-tuned on SWE-agent / OpenHands trajectories (SWE-Gym, SWE-smith, the
 * Qwen coder models) already know this exact interface, so RL starts from their competence instead of teaching a
 * new one; and one schema costs fewer prompt tokens than five. `bash`, `python` and `finish` stay separate tools.
 *
 * Every file access goes through the sandbox (`readFile`, `writeFile`, `listDir`), never host paths. Rules:
 * `create` refuses an existing path (edit it instead); `str_replace` needs `old_str` to occur exactly once and
 * otherwise names the count and the lines; observations are bounded (a large file is shown a page at a time).
 * The model's mistakes are 'error' observations; sandbox failures throw. Undo history is per sandbox (so one
 * instance may serve many samples without leaking between them) and bounded.
 */
export function createEditorTool(): ValidatedTool {
  const histories = new WeakMap<Sandbox, UndoHistory>();
  const history = (sandbox: Sandbox): UndoHistory => {
    let h = histories.get(sandbox);
    if (!h) histories.set(sandbox, (h = new UndoHistory()));
    return h;
  };
  return defineTool({
    name: 'str_replace_editor',
    description:
      'View, create and edit files in the sandbox. Commands: view (a file with line numbers, optionally view_range ' +
      '[first, last]; or a directory listing), create (a new file; fails if it exists), str_replace (replace old_str, ' +
      'which must occur exactly once, by new_str), insert (new_str after line insert_line), undo_edit (revert the last ' +
      'edit of the file).',
    args,
    async run(a, { sandbox, signal }) {
      const path = posix.resolve(sandbox.workdir, a.path);
      const read = () => sandbox.readFile(path, { signal });
      try {
        switch (a.command) {
          case 'view':
            return await view(sandbox, path, a, signal);
          case 'create': {
            const found = await existence(sandbox, path, signal);
            if (found === true) return fail(`${path} already exists. Use str_replace or insert to edit it.`);
            if (found !== false) return fail(`could not check whether ${path} exists, so nothing was created: ${found}`);
            const tooLarge = fileLimitProblem(sandbox, path, a.file_text!);
            if (tooLarge !== undefined) return fail(tooLarge);
            await sandbox.writeFile(path, a.file_text!, { signal });
            return { output: `Created ${path} (${countLines(a.file_text!)} lines).`, outcome: 'ok' };
          }
          case 'str_replace': {
            const text = await read();
            if (a.old_str === '') return fail('old_str is empty: give the exact text to replace.');
            if (!isUtf8Text(text)) return fail(notUtf8(path));
            const r = replaceUnique(text, a.old_str!, a.new_str ?? '');
            if (!r.ok) {
              return fail(
                r.count === 0
                  ? `old_str does not occur in ${path}; nothing was replaced. It must match exactly, whitespace included.`
                  : `old_str occurs ${r.more ? `more than ${r.count}` : r.count} times in ${path} (lines ${r.lines.join(', ')}${r.more ? ', ...' : ''}); nothing was replaced. Include more context to make it unique.`,
              );
            }
            const tooLarge = fileLimitProblem(sandbox, path, r.text);
            if (tooLarge !== undefined) return fail(tooLarge);
            history(sandbox).remember(path, text);
            await sandbox.writeFile(path, r.text, { signal });
            return { output: `Edited ${path}. Around the edit:\n${snippet(r.text, r.line, countLines(a.new_str ?? ''))}`, outcome: 'ok' };
          }
          case 'insert': {
            const text = await read();
            if (!isUtf8Text(text)) return fail(notUtf8(path));
            const count = countLines(text);
            if (a.insert_line! > count) return fail(`insert_line ${a.insert_line} is past the end: ${path} has ${count} lines (use 0..${count}).`);
            const next = insertAfterLine(text, a.insert_line!, a.new_str!);
            const tooLarge = fileLimitProblem(sandbox, path, next);
            if (tooLarge !== undefined) return fail(tooLarge);
            history(sandbox).remember(path, text);
            await sandbox.writeFile(path, next, { signal });
            return { output: `Inserted into ${path}. Around the edit:\n${snippet(next, a.insert_line! + 1, countLines(a.new_str!))}`, outcome: 'ok' };
          }
          case 'undo_edit': {
            const before = histories.get(sandbox)?.pop(path);
            if (before === undefined) return fail(`no edit of ${path} to undo (earlier versions of large files, and the oldest ones past ${UNDO_BUDGET_CHARS >> 20} MiB in all, are not kept).`);
            // A file the image brought, larger than the sandbox lets a process write, edited smaller: its old text cannot be written back.
            const tooLarge = fileLimitProblem(sandbox, path, before);
            if (tooLarge !== undefined) return fail(tooLarge);
            await sandbox.writeFile(path, before, { signal });
            return { output: `Reverted the last edit of ${path}.`, outcome: 'ok' };
          }
        }
      } catch (err) {
        // Missing files, directories where files are expected, paths outside the workspace: the model's doing.
        if (err instanceof RolloutError && (err.code === 'not_found' || err.code === 'invalid_argument')) return fail(err.message);
        throw err;
      }
    },
  });
}

function fail(message: string): ToolResult {
  return { output: `Error: ${message}`, outcome: 'error' };
}

/**
 * Whether a file's text is what its bytes say. The sandbox decodes files as UTF-8, bytes that are not UTF-8 (a
 * Latin-1 source file, a binary) becoming U+FFFD; writing such text back would change every one of those bytes, not
 * just the edit. A file that really holds U+FFFD is refused too: from the text alone the two cannot be told apart.
 */
function isUtf8Text(text: string): boolean {
  return !text.includes('\uFFFD');
}

function notUtf8(path: string): string {
  return `${path} is not valid UTF-8 text (or holds U+FFFD), and the editor would rewrite those bytes; nothing was changed. Edit it with bash (e.g. sed, or python on bytes).`;
}

/**
 * Earlier versions of the files edited in one sandbox, oldest first, for undo_edit: at most UNDO_DEPTH per file and
 * about UNDO_BUDGET_CHARS in all (the path and a small overhead count too), the oldest forgotten first.
 */
class UndoHistory {
  private readonly versions: { path: string; text: string; cost: number }[] = [];
  private cost = 0;

  remember(path: string, before: string): void {
    const cost = before.length + path.length + 64;
    if (cost > UNDO_BUDGET_CHARS) {
      // An edit that cannot be undone: older versions of the file must not be restored past it.
      this.forget((v) => v.path === path);
      return;
    }
    this.versions.push({ path, text: before, cost });
    this.cost += cost;
    let ofPath = this.versions.filter((v) => v.path === path).length;
    this.forget((v) => v.path === path && ofPath-- > UNDO_DEPTH);
    let over = this.cost - UNDO_BUDGET_CHARS;
    this.forget((v) => {
      if (over <= 0) return false;
      over -= v.cost;
      return true;
    });
  }

  pop(path: string): string | undefined {
    const at = this.versions.findLastIndex((v) => v.path === path);
    if (at < 0) return undefined;
    const [v] = this.versions.splice(at, 1);
    this.cost -= v!.cost;
    return v!.text;
  }

  /** Drops the versions `drop` picks, visited oldest first. */
  private forget(drop: (v: { path: string; cost: number }) => boolean): void {
    let kept = 0;
    for (const v of this.versions) {
      if (drop(v)) this.cost -= v.cost;
      else this.versions[kept++] = v;
    }
    this.versions.length = kept;
  }
}

/**
 * Whether `path` exists, as the sandbox's user sees it: true, false, or why that cannot be told (the model's doing: a
 * workspace or directory it made unenterable). Only evidence counts as "exists": a read that found a directory, a
 * special file or more than 0 bytes, or the name in its directory's listing when the read failed for another reason
 * (a file without read permission) — never a failed check, which used to read as "already exists".
 */
async function existence(sandbox: Sandbox, path: string, signal: AbortSignal): Promise<boolean | string> {
  try {
    await sandbox.readFile(path, { signal, maxBytes: 0 });
    return true;
  } catch (err) {
    if (!(err instanceof RolloutError) || (err.code !== 'not_found' && err.code !== 'invalid_argument')) throw err;
    if (err.code === 'not_found') return false;
    if (EXISTS_BY_READ.test(err.message)) return true;
    try {
      const name = posix.basename(path);
      return (await sandbox.listDir(posix.dirname(path), { signal })).some((e) => e.name === name);
    } catch (listErr) {
      if (listErr instanceof RolloutError && listErr.code === 'not_found') return false;
      if (listErr instanceof RolloutError && listErr.code === 'invalid_argument') return err.message;
      throw listErr;
    }
  }
}

/** What a 0-byte read says of a path that exists (both drivers' and the test double's wording). */
const EXISTS_BY_READ = /is a directory|is not a regular file|over the \d+-byte (?:read )?limit/;

async function view(sandbox: Sandbox, path: string, a: Args, signal: AbortSignal): Promise<ToolResult> {
  let text: string;
  try {
    text = await sandbox.readFile(path, { signal });
  } catch (err) {
    if (!(err instanceof RolloutError && err.code === 'invalid_argument')) throw err;
    // Not a readable file: a directory, then (asked of the sandbox: drivers word the read error differently).
    let entries: DirEntry[];
    try {
      entries = await sandbox.listDir(path, { signal });
    } catch (listErr) {
      if (listErr instanceof RolloutError && (listErr.code === 'invalid_argument' || listErr.code === 'not_found')) throw err;
      throw listErr;
    }
    // At most LIST_ENTRIES entries and VIEW_CHARS characters: names run to 255 bytes, and 200 of them were ~52 KB.
    const shown: string[] = [];
    let chars = 0;
    for (const e of entries.slice(0, LIST_ENTRIES)) {
      const line = e.type === 'dir' ? `${e.name}/` : e.type === 'file' ? `${e.name}  (${e.size} bytes)` : `${e.name}  (${e.type})`;
      if (chars + line.length + 1 > VIEW_CHARS) break;
      shown.push(line);
      chars += line.length + 1;
    }
    const more = entries.length > shown.length ? `\n[${entries.length - shown.length} more entries not shown]` : '';
    return { output: `${path}/ (${entries.length} entries)\n${shown.join('\n')}${more}`, outcome: 'ok' };
  }
  const count = countLines(text);
  if (count === 0) return { output: `${path} is empty.`, outcome: 'ok' };
  const [first, lastAsked] = a.view_range ?? [1, -1];
  const last = lastAsked === -1 ? count : lastAsked;
  if (first < 1 || first > count || last < first || last > count) {
    return fail(`view_range [${a.view_range?.join(', ')}] is not within the file's ${count} lines (first 1..${count}, last first..${count} or -1).`);
  }
  let end = Math.min(last, first + VIEW_LINES - 1);
  const page = linesBetween(text, first, end);
  let body = numberLines(page, first);
  while (body.length > VIEW_CHARS && end > first) {
    end = first + Math.max(0, Math.floor((end - first) / 2));
    body = numberLines(page.slice(0, end - first + 1), first);
  }
  const note = end < last ? `\n[showing lines ${first}-${end} of ${count}; view with view_range [${end + 1}, ${Math.min(last, end + VIEW_LINES)}] for more]` : '';
  return { output: `${body}${note}`, outcome: 'ok' };
}

/** Numbered lines around an edit at `line` spanning `span` lines, with 4 lines of context each side. */
function snippet(text: string, line: number, span: number): string {
  const first = Math.max(1, line - 4);
  const last = line + Math.max(span, 1) - 1 + 4;
  return numberLines(linesBetween(text, first, Math.min(last, first + VIEW_LINES - 1)), first);
}
