import { toNumberArray } from './token-column.js';
import { encodeRendered, escapeMessage } from './opaque-content.js';
import { knownSuffixLocality, probeSuffixLocality, suffixDelta, type SuffixLocality } from './suffix-delta.js';
import { contentSlots, renderWithSkeleton } from './template-skeleton.js';
import { environmentDelta, type DeltaMethod, type DeltaRequest } from './template-delta.js';
import { toolsChars } from './tools-key.js';
import type { ChatMessage, ChatTemplate, Tokenizer, ToolSchema } from './types.js';

/**
 * The token work of a trajectory as pure functions of (tokenizer, template, input): the same code runs on the
 * event loop for small inputs and in a token worker (token-worker.ts) for large ones, so where it ran never
 * changes a token.
 */

/** The first prompt: the environment's messages rendered with the generation prompt. */
export interface PromptTask {
  kind: 'prompt';
  /** As the environment gave them (escaped here, see opaque-content.ts). */
  messages: readonly ChatMessage[];
  /** Escaped already (TokenWork escapes them once, see escapeTools), as an EnvironmentTask's. */
  tools: readonly ToolSchema[] | undefined;
}

/** The tokens after an assistant turn: what the template writes for the environment's messages. */
export interface EnvironmentTask extends DeltaRequest {
  kind: 'environment';
  /** Decoded stop token the model sampled to end its turn: not appended again. */
  stopText: string | undefined;
}

export type TokenTask = PromptTask | EnvironmentTask;

export interface TokenTaskResult {
  ids: number[];
  /** For environment tasks: how the between-turns text was found. */
  method?: DeltaMethod;
  /**
   * For environment tasks: the template's suffix locality with the task's tools, as the thread that ran it probed it;
   * the event loop keeps it (rememberSuffixLocality) instead of probing itself.
   */
  locality?: SuffixLocality;
  /**
   * `JSON.stringify(ids)`, for prompt tasks run on a token thread: the first engine request of a trajectory sends
   * the whole prompt as JSON, and at 55K ids serializing it cost the event loop milliseconds (see prompt-json.ts).
   * With as many ids as are sent packed, the text's bytes, transferred (JsonPiece).
   */
  idsJson?: string | Uint8Array;
  /**
   * The ids as sent by a token thread when there are many: an Int32Array whose buffer is transferred, not cloned, and
   * `ids` left empty. Deserializing a cloned 55K-element array cost the event loop ~1 ms; copying the ids out of a
   * transferred buffer a quarter of that. {@link unpackIds} restores `ids` (an environment delta's); a prompt's stay
   * packed (TokenWork.promptIds).
   */
  packedIds?: Int32Array;
  /**
   * For prompt tasks with many ids run on a token thread: the ids as the packed varints of the trajectory's
   * prompt_token_ids (tokens/packed-varints.ts), written there and transferred, so delivering each of the prompt's
   * trajectories copies them instead of encoding 55K ids on the event loop.
   */
  promptVarints?: Uint8Array;
}

/** Ids past which a token thread sends them packed (see TokenTaskResult.packedIds). */
export const PACK_IDS_FROM = 4096;

/** Packs a large result's ids for the transfer from a token thread; returns what to transfer. */
export function packIds(result: TokenTaskResult): ArrayBuffer[] {
  if (result.ids.length < PACK_IDS_FROM) return [];
  const packed = Int32Array.from(result.ids);
  result.packedIds = packed;
  result.ids = [];
  return [packed.buffer];
}

/** The result with its ids as an array again (they came packed from a token thread, or were never packed). */
export function unpackIds(result: TokenTaskResult): TokenTaskResult {
  const { packedIds, ...rest } = result;
  if (packedIds === undefined) return result;
  return { ...rest, ids: toNumberArray(packedIds) };
}

/** Renders the escaped prompt with the generation prompt and encodes it (template tokens only from the template). */
export function promptIds(tokenizer: Tokenizer, template: ChatTemplate, task: Omit<PromptTask, 'kind'>): number[] {
  const escaped = task.messages.map((m) => escapeMessage(tokenizer, m));
  const options = task.tools === undefined ? { addGenerationPrompt: true } : { addGenerationPrompt: true, tools: task.tools };
  // From the shape's skeleton when the template writes these contents verbatim (template-skeleton.ts): no render.
  const slots = contentSlots(escaped);
  const text = slots.length === escaped.length ? renderWithSkeleton(template, escaped, options, slots) : template.render(escaped, options);
  return encodeRendered(tokenizer, text);
}

/**
 * The ids to append after an assistant turn (see TokenLedger.appendEnvironment): the delta from a suffix of the
 * conversation when the template is suffix-local, else from the whole conversation; minus the stop token the
 * model sampled itself; encoded with environment contents opaque.
 */
export function environmentIds(tokenizer: Tokenizer, template: ChatTemplate, task: Omit<EnvironmentTask, 'kind'>): Required<Pick<TokenTaskResult, 'ids' | 'method' | 'locality'>> {
  const locality = probeSuffixLocality(template, task.tools);
  const delta = (locality.local ? suffixDelta(template, task, locality) : undefined) ?? environmentDelta(template, task);
  const stop = task.stopText;
  const text = stop !== undefined && delta.text.startsWith(stop) ? delta.text.slice(stop.length) : delta.text;
  return { ids: encodeRendered(tokenizer, text), method: delta.method, locality };
}

/** Runs a task. */
export function runTokenTask(tokenizer: Tokenizer, template: ChatTemplate, task: TokenTask): TokenTaskResult {
  return task.kind === 'prompt' ? { ids: promptIds(tokenizer, template, task) } : environmentIds(tokenizer, template, task);
}

/**
 * Characters a task renders and encodes: what its cost is proportional to, to choose between the event loop and
 * a worker. The tools' schemas count where the render writes them (a prompt; a delta rendered with them). An
 * environment task on a suffix-local template costs its new messages and the last assistant turn, whatever the
 * length of the conversation. An environment task for a tool list this thread has not probed the template with is
 * unbounded (Infinity): the probe renders the template a few hundred times (70-600 ms), so it belongs on a token
 * thread, whose answer then tells this thread the locality (TokenTaskResult.locality).
 */
export function taskChars(template: ChatTemplate, task: TokenTask): number {
  const chars = (messages: readonly ChatMessage[]): number => messages.reduce((n, m) => n + m.content.length, 0);
  if (task.kind === 'prompt') return chars(task.messages) + toolsChars(task.tools);
  const locality = knownSuffixLocality(template, task.tools);
  if (locality === undefined) return Number.POSITIVE_INFINITY;
  const rendered = locality.local ? (task.history.at(-1)?.content.length ?? 0) : chars(task.history);
  return chars(task.added) + rendered + (!locality.local || locality.tools ? toolsChars(task.tools) : 0);
}
