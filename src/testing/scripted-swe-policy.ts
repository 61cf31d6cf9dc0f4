import { posix } from 'node:path';
import { parseUnifiedDiff } from '../environments/swe/unified-diff.js';
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
  return parseUnifiedDiff(patch).flatMap((file) => {
    if (file.oldPath === '/dev/null' || file.newPath === '/dev/null') throw new Error(`${file.oldPath} → ${file.newPath}: adding or deleting files is not a str_replace`);
    return file.hunks.map((h) => ({ path: posix.join(root, file.newPath), old_str: h.oldText, new_str: h.newText }));
  });
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
