/** A chat message as the chat template sees it. */
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string;
  /** Tool name, for role "tool". */
  name?: string;
}

/** JSON-schema description of a tool, as passed to the chat template's `tools` variable (OpenAI function form). */
export interface ToolSchema {
  type: 'function';
  function: { name: string; description: string; parameters: Record<string, unknown> };
}

/**
 * A piece of text to encode. A `literal` piece is environment text: added-token strings in it (e.g. a tool that
 * prints "<|im_start|>") are ordinary characters, never token ids.
 */
export interface TextPart {
  text: string;
  literal: boolean;
}

/**
 * A tokenizer loaded from a Hugging Face tokenizer.json. Special tokens in text (e.g. <|im_start|>) are parsed
 * as special tokens by `encode`; no BOS/EOS is added implicitly.
 */
export interface Tokenizer {
  encode(text: string): number[];
  /**
   * Encodes the parts joined: added tokens are recognized in the runs of non-literal parts only (a match never
   * spans a literal part), and the text between two recognized added tokens is encoded as one piece, so text
   * without literal parts encodes exactly as `encode(joined)`. Literal parts never yield an added-token id unless plain
   * BPE text does.
   */
  encodeParts(parts: readonly TextPart[]): number[];
  /** The added tokens' strings (special or not, e.g. <|im_end|>, <tool_call>), in tokenizer.json order. */
  readonly addedTokens: readonly string[];
  /**
   * The added tokens that are text, not chat structure (whitespace runs, HTML tags the template does not write;
   * see opaque-content.ts textAddedTokens): environment text keeps them as the tokenizer finds them.
   */
  readonly textTokens: ReadonlySet<string>;
  decode(ids: readonly number[], options?: { skipSpecialTokens?: boolean }): string;
  /** Id of a token string (special or not), undefined if absent. */
  tokenId(token: string): number | undefined;
  /** Ids that end an assistant turn (e.g. <|im_end|>, <|endoftext|>). */
  readonly stopTokenIds: readonly number[];
}

/** Renders a conversation with the model's own chat template. */
export interface ChatTemplate {
  render(messages: readonly ChatMessage[], options: { addGenerationPrompt: boolean; tools?: readonly ToolSchema[] }): string;
}
