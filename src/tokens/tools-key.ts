import { createHash } from 'node:crypto';
import type { ToolSchema } from './types.js';

/**
 * A tool list as a cache key: equal lists share entries (a token thread receives a copy of the list with every task).
 * A short list is keyed by its JSON, a longer one by the SHA-256 of its JSON, so a key stays small whatever the
 * schemas hold and the per-template caches (closing, suffix locality, skeletons, prompts) can keep every list: they
 * used to refuse lists of more than 32 Ki characters, and such a list then had the template probed again — hundreds of
 * renders, 0.3-0.6 s with 40-100 KB of schemas — on every environment turn. Memoized per array, since those caches
 * each ask on every turn and serializing the schemas again each time showed up in profiles. '' for no tools.
 */
export function toolsKey(tools: readonly ToolSchema[] | undefined): string {
  return describe(tools).key;
}

/** Characters of the tool list's JSON (0 for none): what a render that writes the schemas costs, in proportion. */
export function toolsChars(tools: readonly ToolSchema[] | undefined): number {
  return describe(tools).chars;
}

/** JSON of at most this many characters is its own key; a longer one is keyed by its digest. */
export const MAX_RAW_TOOLS_KEY = 256;

function describe(tools: readonly ToolSchema[] | undefined): { key: string; chars: number } {
  if (tools === undefined || tools.length === 0) return NONE;
  let found = memo.get(tools);
  if (found === undefined) {
    const json = JSON.stringify(tools);
    // A digest never collides with a raw key: those are JSON arrays and start with "[".
    const key = json.length <= MAX_RAW_TOOLS_KEY ? json : `#${createHash('sha256').update(json).digest('base64')}`;
    memo.set(tools, (found = { key, chars: json.length }));
  }
  return found;
}

const NONE = { key: '', chars: 0 };
const memo = new WeakMap<readonly ToolSchema[], { key: string; chars: number }>();
