import type { TemplateProfile } from './template-profile.js';
import type { ChatMessage, ChatTemplate, ToolSchema } from './types.js';

/** Writes the instructions for calling `tools`, for a template that does not describe them itself. */
export type ToolInstructions = (tools: readonly ToolSchema[]) => string;

/**
 * A model's template, with the conversation shaped into what it accepts (see {@link TemplateProfile}):
 * - no tool role: each run of tool messages becomes one user message, every result headed
 *   `Output of tool "<name>":` (or `Tool output:`), so the model can tell tool output from its user;
 * - turns must alternate: consecutive user messages are joined (blank line between);
 * - turns must alternate, or a later system message would not render in place: a system message after the first
 *   message becomes a user message;
 * - tools not rendered: `instructions(tools)` goes at the top of the system prompt (a system message is added
 *   when there is none), so the model still learns its tools and the call format the parser reads.
 * With a template that needs none of this (Qwen3) the messages pass through unchanged, so its renders are
 * exactly the template's own.
 *
 * Invariants the ledger relies on: rendering stays pure; the shaping of a message depends only on it and its
 * run of neighbours, so appending messages after an assistant turn never changes how earlier ones render;
 * assistant contents are never touched; contents are only prefixed or joined, never cut (placeholders of
 * opaque-content.ts survive).
 */
export class AdaptedChatTemplate implements ChatTemplate {
  constructor(
    readonly inner: ChatTemplate,
    readonly profile: TemplateProfile,
    private readonly instructions: ToolInstructions,
  ) {}

  /** Whether this adapter changes anything for its template. */
  get adapts(): boolean {
    const { toolRole, alternates, rendersTools, laterSystemInPlace } = this.profile;
    return !toolRole || alternates || !rendersTools || !laterSystemInPlace;
  }

  render(messages: readonly ChatMessage[], options: { addGenerationPrompt: boolean; tools?: readonly ToolSchema[] }): string {
    return this.inner.render(this.shape(messages, options.tools), options);
  }

  /** The messages as the template gets them. */
  shape(messages: readonly ChatMessage[], tools: readonly ToolSchema[] | undefined): ChatMessage[] {
    const { toolRole, alternates, rendersTools, laterSystemInPlace } = this.profile;
    const out: ChatMessage[] = [];
    let lastJoinable = false;
    for (const [k, message] of messages.entries()) {
      let next: ChatMessage = message;
      let joinable = false;
      if (message.role === 'tool' && !toolRole) {
        const head = message.name === undefined ? 'Tool output:' : `Output of tool ${JSON.stringify(message.name)}:`;
        next = { role: 'user', content: `${head}\n${message.content}` };
        joinable = true;
      } else if ((alternates || !laterSystemInPlace) && message.role === 'system' && k > 0) {
        next = { role: 'user', content: message.content };
      }
      const last = out.at(-1);
      const join = last !== undefined && last.role === 'user' && next.role === 'user' && (alternates || (joinable && lastJoinable));
      if (join) out[out.length - 1] = { role: 'user', content: `${last.content}\n\n${next.content}` };
      else out.push(next === message ? { ...message } : next);
      lastJoinable = joinable;
    }
    if (!rendersTools && tools !== undefined && tools.length > 0) {
      const text = this.instructions(tools);
      if (out[0]?.role === 'system') out[0] = { ...out[0], content: `${text}\n\n${out[0].content}` };
      else out.unshift({ role: 'system', content: text });
    }
    return out;
  }
}
