import type { Sandbox } from '../sandboxes/types.js';

export interface ToolCall {
  name: string;
  arguments: Record<string, unknown>;
}

/** Result of parsing one assistant message for tool calls. A malformed call is an error, never a throw. */
export interface ParsedToolCalls {
  calls: ToolCall[];
  /** One message per malformed call (bad JSON, missing name, ...), to show the model as an observation. */
  errors: string[];
}

/** Extracts tool calls from assistant text. Implementations: Hermes/Qwen `<tool_call>{json}</tool_call>`. */
export interface ToolCallParser {
  readonly name: string;
  parse(text: string): ParsedToolCalls;
}

export interface ToolContext {
  sandbox: Sandbox;
  signal: AbortSignal;
}

export interface ToolResult {
  /** The observation shown to the model. */
  output: string;
  outcome: 'ok' | 'error' | 'finish';
  /** For outcome 'finish': the answer submitted. */
  answer?: string;
}

/** A tool the model can call. Errors the model caused are results (outcome 'error'), not throws. */
export interface Tool {
  readonly name: string;
  readonly description: string;
  /** JSON Schema of the arguments object. */
  readonly parameters: Record<string, unknown>;
  run(args: Record<string, unknown>, context: ToolContext): Promise<ToolResult>;
}
