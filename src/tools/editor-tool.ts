import { posix } from 'node:path';
import { z } from 'zod';
import { RolloutError } from '../errors.js';
import type { Sandbox } from '../sandboxes/types.js';
import { defineTool, type ValidatedTool } from './define-tool.js';
import { insertAfterLine, numberLines, replaceUnique, splitLines } from './text-edit.js';
import type { ToolResult } from './types.js';

/** Lines one `view` shows at most; the note says how to see the rest. */
const VIEW_LINES = 300;
/** Characters of one `view` observation at most (long lines are cut first). */
const VIEW_CHARS = 20_000;
/** Entries of a directory listing at most. */
const LIST_ENTRIES = 200;
/** Versions kept per file for undo_edit, and the largest file whose old version is kept. */
const UNDO_DEPTH = 5;
const UNDO_MAX_CHARS = 1 << 20;

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
  const history = new WeakMap<Sandbox, Map<string, string[]>>();
  const remember = (sandbox: Sandbox, path: string, before: string): void => {
    let files = history.get(sandbox);
    if (!files) history.set(sandbox, (files = new Map()));
    const versions = files.get(path) ?? [];
    versions.push(before.length <= UNDO_MAX_CHARS ? before : '');
    if (before.length > UNDO_MAX_CHARS) versions.length = 0;
    files.set(path, versions.slice(-UNDO_DEPTH));
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
            if (await exists(sandbox, path, signal)) return fail(`${path} already exists. Use str_replace or insert to edit it.`);
            await sandbox.writeFile(path, a.file_text!, { signal });
            return { output: `Created ${path} (${splitLines(a.file_text!).length} lines).`, outcome: 'ok' };
          }
          case 'str_replace': {
            const text = await read();
            if (a.old_str === '') return fail('old_str is empty: give the exact text to replace.');
            const r = replaceUnique(text, a.old_str!, a.new_str ?? '');
            if (!r.ok) {
              return fail(
                r.count === 0
                  ? `old_str does not occur in ${path}; nothing was replaced. It must match exactly, whitespace included.`
                  : `old_str occurs ${r.more ? `more than ${r.count}` : r.count} times in ${path} (lines ${r.lines.join(', ')}${r.more ? ', ...' : ''}); nothing was replaced. Include more context to make it unique.`,
              );
            }
            remember(sandbox, path, text);
            await sandbox.writeFile(path, r.text, { signal });
            return { output: `Edited ${path}. Around the edit:\n${snippet(r.text, r.line, splitLines(a.new_str ?? '').length)}`, outcome: 'ok' };
          }
          case 'insert': {
            const text = await read();
            const count = splitLines(text).length;
            if (a.insert_line! > count) return fail(`insert_line ${a.insert_line} is past the end: ${path} has ${count} lines (use 0..${count}).`);
            const next = insertAfterLine(text, a.insert_line!, a.new_str!);
            remember(sandbox, path, text);
            await sandbox.writeFile(path, next, { signal });
            return { output: `Inserted into ${path}. Around the edit:\n${snippet(next, a.insert_line! + 1, splitLines(a.new_str!).length)}`, outcome: 'ok' };
          }
          case 'undo_edit': {
            const versions = history.get(sandbox)?.get(path);
            const before = versions?.pop();
            if (before === undefined) return fail(`no edit of ${path} to undo.`);
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

async function exists(sandbox: Sandbox, path: string, signal: AbortSignal): Promise<boolean> {
  try {
    await sandbox.readFile(path, { signal, maxBytes: 0 });
    return true;
  } catch (err) {
    if (err instanceof RolloutError && err.code === 'not_found') return false;
    if (err instanceof RolloutError && err.code === 'invalid_argument' && !/parent is not a directory|NUL|outside/.test(err.message)) return true;
    throw err;
  }
}

async function view(sandbox: Sandbox, path: string, a: Args, signal: AbortSignal): Promise<ToolResult> {
  let text: string;
  try {
    text = await sandbox.readFile(path, { signal });
  } catch (err) {
    if (!(err instanceof RolloutError && err.code === 'invalid_argument' && /directory/.test(err.message))) throw err;
    const entries = await sandbox.listDir(path, { signal });
    const shown = entries.slice(0, LIST_ENTRIES).map((e) => (e.type === 'dir' ? `${e.name}/` : e.type === 'file' ? `${e.name}  (${e.size} bytes)` : `${e.name}  (${e.type})`));
    const more = entries.length > LIST_ENTRIES ? `\n[${entries.length - LIST_ENTRIES} more entries not shown]` : '';
    return { output: `${path}/ (${entries.length} entries)\n${shown.join('\n')}${more}`, outcome: 'ok' };
  }
  const lines = splitLines(text);
  if (lines.length === 0) return { output: `${path} is empty.`, outcome: 'ok' };
  const [first, lastAsked] = a.view_range ?? [1, -1];
  const last = lastAsked === -1 ? lines.length : lastAsked;
  if (first < 1 || first > lines.length || last < first || last > lines.length) {
    return fail(`view_range [${a.view_range?.join(', ')}] is not within the file's ${lines.length} lines (first 1..${lines.length}, last first..${lines.length} or -1).`);
  }
  let end = Math.min(last, first + VIEW_LINES - 1);
  let body = numberLines(lines.slice(first - 1, end), first);
  while (body.length > VIEW_CHARS && end > first) {
    end = first + Math.max(0, Math.floor((end - first) / 2));
    body = numberLines(lines.slice(first - 1, end), first);
  }
  const note = end < last ? `\n[showing lines ${first}-${end} of ${lines.length}; view with view_range [${end + 1}, ${Math.min(last, end + VIEW_LINES)}] for more]` : '';
  return { output: `${body}${note}`, outcome: 'ok' };
}

/** Numbered lines around an edit at `line` spanning `span` lines, with 4 lines of context each side. */
function snippet(text: string, line: number, span: number): string {
  const lines = splitLines(text);
  const first = Math.max(1, line - 4);
  const last = Math.min(lines.length, line + Math.max(span, 1) - 1 + 4);
  return numberLines(lines.slice(first - 1, last).slice(0, VIEW_LINES), first);
}
