import type { ToolSchema } from './types.js';

/**
 * A tool list as a cache key: its JSON, so equal lists share entries (a token thread receives a copy of the list with
 * every task), memoized per array, since the per-template caches (closing, suffix locality, skeletons, prompts) each
 * ask on every turn and serializing the schemas again each time showed up in profiles. '' for no tools.
 */
export function toolsKey(tools: readonly ToolSchema[] | undefined): string {
  if (tools === undefined || tools.length === 0) return '';
  let key = keys.get(tools);
  if (key === undefined) keys.set(tools, (key = JSON.stringify(tools)));
  return key;
}

const keys = new WeakMap<readonly ToolSchema[], string>();
