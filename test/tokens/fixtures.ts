import type { SampledTurn } from '../../src/tokens/ledger.js';
import type { Tokenizer, ToolSchema } from '../../src/tokens/types.js';

/** A tool schema in the OpenAI function form, with a non-ASCII description to check tojson. */
export const bashTool: ToolSchema = {
  type: 'function',
  function: {
    name: 'bash',
    description: 'Run a "bash" command — returns stdout',
    parameters: { type: 'object', properties: { cmd: { type: 'string' } }, required: ['cmd'] },
  },
};

/** Qwen/Hermes tool-call text as the model writes it. */
export function toolCallText(cmd: string): string {
  return `<tool_call>\n{"name": "bash", "arguments": {"cmd": ${JSON.stringify(cmd)}}}\n</tool_call>`;
}

/** A completion whose ids are the canonical tokenization of `text`, ending with <|im_end|> unless cut by length. */
export function canonicalSample(
  tokenizer: Tokenizer,
  text: string,
  ending: 'stop' | 'length',
  policyVersion = 1,
): SampledTurn {
  const imEnd = tokenizer.tokenId('<|im_end|>')!;
  const tokenIds = [...tokenizer.encode(text), ...(ending === 'stop' ? [imEnd] : [])];
  return sampled(tokenIds, ending, policyVersion);
}

/** A completion with the given ids and made-up, distinct logprobs. */
export function sampled(tokenIds: readonly number[], finishReason: 'stop' | 'length', policyVersion = 1): SampledTurn {
  return {
    tokenIds,
    logprobs: tokenIds.map((_, i) => -0.01 * (i + 1)),
    backend: 'fake-engine',
    policyVersion,
    finishReason,
  };
}
