import { parsePatch, type StructuredPatchHunk } from 'diff';
import { posix } from 'node:path';
import { patchFileName } from '../environments/swe/patch-paths.js';
import { hermesToolCall, type FakePolicy } from './scripted-policy.js';

/** One `str_replace_editor` str_replace call: `old_str` must occur exactly once in `path` (absolute). */
export interface ScriptedEdit {
  path: string;
  old_str: string;
  new_str: string;
}

/**
 * The str_replace calls that make a unified diff's changes: one per hunk, its old text (context and removed lines)
 * replaced by its new text, paths resolved under `root` (the working copy, e.g. /work/testbed). Hunks that add or
 * delete whole files are not expressible as str_replace and are refused.
 */
export function editsFromPatch(patch: string, root: string): ScriptedEdit[] {
  return parsePatch(patch).flatMap((file) => {
    const oldPath = patchFileName(file.oldFileName, 'a/');
    const newPath = patchFileName(file.newFileName, 'b/');
    if (oldPath === undefined || newPath === undefined) throw new Error(`${file.oldFileName} → ${file.newFileName}: adding or deleting files is not a str_replace`);
    return file.hunks.map((h) => ({ path: posix.join(root, newPath), ...hunkTexts(h) }));
  });
}

/**
 * A hunk's old text (context and removed lines) and new text (context and added lines). "\ No newline at end of
 * file" takes the newline off the line before it, on the side(s) that line belongs to.
 */
export function hunkTexts(hunk: StructuredPatchHunk): { old_str: string; new_str: string } {
  const old: string[] = [];
  const added: string[] = [];
  let last: 'old' | 'new' | 'both' = 'both';
  for (const line of hunk.lines) {
    const text = `${line.slice(1)}\n`;
    if (line.startsWith('\\')) {
      for (const side of last === 'old' ? [old] : last === 'new' ? [added] : [old, added]) {
        const end = side.length - 1;
        if (end >= 0) side[end] = side[end]!.replace(/\n$/, '');
      }
    } else if (line.startsWith('-')) {
      old.push(text);
      last = 'old';
    } else if (line.startsWith('+')) {
      added.push(text);
      last = 'new';
    } else {
      // Context: ' ', or an empty line (a context line whose space was stripped, as some editors do).
      old.push(text);
      added.push(text);
      last = 'both';
    }
  }
  return { old_str: old.join(''), new_str: added.join('') };
}

/**
 * A scripted SWE "agent" for the str_replace_editor, bash and finish tools: its first call runs `git status` in the
 * bash tool (the shell starts in the repository), then it makes `edits` one per turn with str_replace_editor, then
 * calls finish. Which step it is on is the number of tool responses in the prompt, so a failed edit (an error
 * observation) does not stop it: the episode is graded on whatever the repository holds.
 */
export function createScriptedSwePolicy(edits: readonly ScriptedEdit[]): FakePolicy {
  return (promptText) => {
    const step = countToolResponses(promptText);
    if (step === 0) return `Let me look at the repository first.\n${hermesToolCall('bash', { command: 'git status --short && pwd' })}`;
    const edit = edits[step - 1];
    if (edit) return `Editing ${edit.path}.\n${hermesToolCall('str_replace_editor', { command: 'str_replace', ...edit })}`;
    return `Done.\n${hermesToolCall('finish', { answer: edits.length === 0 ? 'no change' : `${edits.length} edits` })}`;
  };
}

/** How many tool results the conversation holds (Qwen's template wraps each in <tool_response>). */
export function countToolResponses(promptText: string): number {
  return promptText.split('<tool_response>').length - 1;
}
