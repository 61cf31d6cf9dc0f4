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

/**
 * Extracts tool calls from assistant text, in one model family's format. Implementations (src/tools/parsers.ts):
 * Hermes/Qwen `<tool_call>{json}</tool_call>`, Llama 3.1 JSON, DeepSeek-V3's special-token form.
 *
 * Invariant: `parse(format(calls))` gives back `calls` with no errors (property-tested), so the instructions
 * shown to a model whose template does not describe tools, and scripted test policies, write what is parsed.
 */
export interface ToolCallParser {
  readonly name: string;
  parse(text: string): ParsedToolCalls;
  /** The calls as the model family writes them (one assistant message's worth). */
  format(calls: readonly ToolCall[]): string;
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

/**
 * A tool the model can call. Errors the model caused are results (outcome 'error'), not throws.
 *
 * Lifecycle: `Environment.tools(instance)` is called once per sample, and the agent loop calls `dispose()` on
 * each tool it returned when the sample ends (however it ends; errors are logged, never thrown). State that must
 * not leak between samples lives in per-sample tool instances or is keyed by the sample's sandbox — never in
 * module singletons. A tool instance shared by several samples must not implement `dispose`.
 */
export interface Tool {
  readonly name: string;
  readonly description: string;
  /** JSON Schema of the arguments object. */
  readonly parameters: Record<string, unknown>;
  run(args: Record<string, unknown>, context: ToolContext): Promise<ToolResult>;
  /** Releases what this per-sample instance holds (connections, helper processes, caches); called once. */
  dispose?(): Promise<void>;
}
