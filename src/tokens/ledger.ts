import type { GenerateResult, LogprobsMode, TokenIds } from '../backends/types.js';
import { RolloutError } from '../errors.js';
import { probeAssistantClosing, type DeltaMethod } from './template-delta.js';
import type { ChatMessage, ChatTemplate, Tokenizer, ToolSchema } from './types.js';
import { verifyLedgerSnapshot } from './verify.js';
import { escapeMessage, escapeTools } from './opaque-content.js';
import { TokenWork } from './token-work.js';
import { idColumn, logprobColumn, maskColumn, type TokenColumn } from './token-column.js';
import { attachedIdsJson, attachIdsJson, innerPiece, type JsonPiece } from '../backends/prompt-json.js';

/** What came of a tool call, as the contract's ToolOutcome. */
export type ToolOutcome = 'ok' | 'error' | 'malformed' | 'finish';

/**
 * A span [start, end) of the response. Assistant spans hold sampled tokens (mask 1); tool and user spans hold
 * template and environment tokens (mask 0), including the closing of the previous assistant turn that the
 * model did not sample itself (e.g. "\n" after <|im_end|>) and the next generation prompt. One assistant message
 * may be several consecutive assistant spans: each after the first `continuesTurn`, the one before it ended
 * "abort" (see {@link TokenLedger.appendSampled}).
 */
export interface LedgerTurn {
  role: 'assistant' | 'tool' | 'user';
  start: number;
  end: number;
  backend?: string;
  /** The policy version that sampled the span's last token (assistant spans). */
  policyVersion?: number;
  /** Which logprobs the sampling engine reports (assistant turns; absent when unknown). */
  logprobsMode?: LogprobsMode;
  /** The policy version when the span's request was sent; differs from policyVersion when the span mixes two. */
  policyVersionStart?: number;
  /** The span continues the previous assistant span's message (whose request was aborted). */
  continuesTurn?: boolean;
  finishReason?: GenerateResult['finishReason'];
  toolName?: string;
  toolOutcome?: ToolOutcome;
}

/**
 * The token record of a trajectory, as the trainer consumes it. Invariants (checked by
 * {@link verifyLedgerSnapshot}): responseIds, mask and logprobs have one entry per token; logprobs are 0 where
 * the mask is 0; turns tile [0, responseIds.length); assistant turns are exactly the mask-1 spans.
 */
export interface LedgerSnapshot {
  /**
   * The ledger's own prompt ids (shared with the other samples of its group): read-only. A number[], or the
   * Int32Array a long prompt came in from its token thread (see TokenWork.promptIds).
   */
  promptIds: TokenIds;
  responseIds: number[];
  /** 1 = sampled by the policy (trained on), 0 = template or environment (never trained on). */
  mask: number[];
  /** The engine's logprob of each sampled token, 0 elsewhere. */
  logprobs: number[];
  turns: LedgerTurn[];
  /** The conversation; assistant contents are decoded from the sampled ids (without the final stop token). */
  messages: ChatMessage[];
  /** Smallest and largest policy version that sampled a span (start and end versions); both 0 when none was sampled. */
  policyVersionMin: number;
  policyVersionMax: number;
  /** promptIds.length + responseIds.length: what the engine's context holds. */
  totalTokens: number;
}

/** One engine completion to record. */
export interface SampledTurn {
  tokenIds: readonly number[];
  /** One per token id. */
  logprobs: readonly number[];
  /** Which engine sampled it (id or URL). */
  backend: string;
  /** The version that sampled the last token. */
  policyVersion: number;
  /** The version when the request was sent (default: policyVersion): less when the weights changed under it. */
  policyVersionStart?: number;
  finishReason: GenerateResult['finishReason'];
  /** Which logprobs the engine reports; undefined when unknown. */
  logprobsMode?: LogprobsMode | undefined;
}

/** What the environment's messages answer. */
export interface EnvironmentMeta {
  toolName?: string;
  toolOutcome?: ToolOutcome;
  /**
   * The most tokens the context may hold (prompt + response): environment text that would take it past this is not
   * appended (appendEnvironment answers false and the ledger stays as it was), so a trajectory never exceeds its
   * budget through what a tool printed.
   */
  maxTotalTokens?: number;
}

type LedgerState = 'awaiting_sample' | 'awaiting_environment' | 'appending_environment' | 'finished';

/** Construction of a {@link TokenLedger}. */
export interface TokenLedgerOptions {
  tokenizer: Tokenizer;
  template: ChatTemplate;
  /** The first messages (system, user) from the environment. */
  messages: readonly ChatMessage[];
  tools?: readonly ToolSchema[];
  /**
   * Where rendering and tokenizing run: a TokenWork with a worker pool moves large inputs off the event loop.
   * It must hold this `tokenizer` and `template`. Default: inline, on the calling thread.
   */
  work?: TokenWork;
  /**
   * An object every asker of this prompt shares (the task): with it, `work` computes the prompt's cache key once for
   * the task's admission check and ledgers instead of once per ledger (see TokenWork.promptIds).
   */
  promptKeyHint?: object;
}

/** The largest id a trajectory can carry: token ids are int32 in the contract (and in the ledger's columns). */
const MAX_TOKEN_ID = 0x7fffffff;

/** Prompt ids computed by {@link TokenLedger.create} for the options object it then constructs with. */
const preparedPrompts = new WeakMap<TokenLedgerOptions, TokenIds>();

/**
 * The token record of one trajectory: what the engine saw (prompt + response) and, for each response token,
 * whether the policy sampled it.
 *
 * Why token-in/token-out: re-tokenizing sampled text can give different ids ("hello" sampled as h·e·l·l·o
 * re-tokenizes to one token), so the trainer would compute logprobs of tokens the policy never sampled. The
 * ledger therefore appends the engine's ids verbatim and only ever tokenizes template and environment text:
 * "render the conversation, tokenize the delta" (see environmentDelta). The context sent to the engine for
 * the next turn is exactly prompt + response, so the record is what the model was actually conditioned on.
 *
 * Invariants, held after every call (a violation would silently corrupt training, so they are checked):
 * - responseIds, mask and logprobs have equal length;
 * - logprobs are 0 where the mask is 0 (those tokens carry no policy gradient);
 * - turns tile [0, responseIds.length) in order, assistant turns exactly at the mask-1 spans;
 * - every sampled id appears verbatim, in order, inside its assistant turn; earlier tokens never change;
 * - mask-0 spans and the prompt hold added tokens (<|im_start|>, <tool_call>, ...) only where the template wrote
 *   them: environment contents (the first messages, tool results) are plain text whatever they spell, so a tool
 *   cannot forge a turn the policy is then conditioned on (opaque-content.ts; checked at every encode).
 *
 * Turns alternate: appendSampled, then appendEnvironment or finish; anything else is `failed_precondition` —
 * except after a completion that ended "abort" (its request was aborted, e.g. by a pause for a weight update):
 * the next appendSampled continues the same assistant message as a new span marked `continuesTurn`.
 *
 * Where the token work runs (inline, or on token worker threads for large inputs) is the `work` option's business
 * (token-work.ts); it never changes a token. Use {@link TokenLedger.create} and await appendEnvironment so that
 * a long prompt or conversation is rendered and tokenized off the event loop.
 *
 * @example
 * const ledger = await TokenLedger.create({ tokenizer, template, messages, tools, work });
 * const out = await engine.generate({ promptIds: ledger.contextIds(), maxTokens, signal });
 * ledger.appendSampled({ ...out, backend: engine.url, policyVersion: 7 });
 * await ledger.appendEnvironment([{ role: 'tool', content: 'ok', name: 'bash' }], { toolName: 'bash', toolOutcome: 'ok' });
 */
export class TokenLedger {
  /** The prompt's ids, read-only: a number[], or the Int32Array a long prompt came in from its token thread. */
  readonly promptIds: TokenIds;
  /**
   * The engine's context, prompt then response ids, and the response's mask and logprobs: columns off the V8 heap
   * while the trajectory runs (see token-column.ts). Response position i is context position promptIds.length + i.
   */
  private readonly context: TokenColumn<Int32Array>;
  private readonly mask = maskColumn();
  private readonly logprobs = logprobColumn();
  private readonly turns: LedgerTurn[] = [];
  private readonly history: ChatMessage[];
  /** The history as the template renders it: environment contents escaped (see opaque-content.ts). */
  private readonly rendered: ChatMessage[];
  private readonly tools: readonly ToolSchema[] | undefined;
  private readonly tokenizer: Tokenizer;
  private readonly work: TokenWork;
  private readonly closing: string;
  private state: LedgerState = 'awaiting_sample';
  /** Decoded stop token that ended the last assistant turn, if it ended with one. */
  private lastStopText: string | undefined;
  /** Where the current assistant message's first span starts (its spans are decoded together). */
  private messageStart = 0;
  private readonly methods: Record<DeltaMethod, number> = { prefix: 0, anchor: 0, isolated: 0 };
  /** The context's first `count` ids, comma-separated, in pieces: JSON kept for contextIds (ids are only ever appended). */
  private readonly serialized = { pieces: [] as JsonPiece[], count: 0 };

  /**
   * A ledger whose prompt is rendered and tokenized on the event loop, whatever its length; see
   * {@link TokenLedger.create} for one that uses `options.work`'s threads.
   */
  constructor(options: TokenLedgerOptions) {
    if (options.messages.length === 0) throw RolloutError.invalid('messages', 'a conversation needs a first message');
    this.tokenizer = options.tokenizer;
    this.work = options.work ?? TokenWork.inline(options.tokenizer, options.template);
    if (this.work.tokenizer !== options.tokenizer || this.work.template !== options.template) {
      throw new RolloutError('internal', 'the ledger\'s TokenWork holds another tokenizer or template');
    }
    this.tools = options.tools;
    this.history = options.messages.map((m) => ({ ...m }));
    this.rendered = this.history.map((m) => escapeMessage(this.tokenizer, m));
    this.promptIds = preparedPrompts.get(options) ?? this.work.promptIdsSync(this.history, this.tools);
    // Room for the response without regrowing for most trajectories: a quarter of the prompt (at least 1,024 ids).
    // A 64K-token context regrown once was a fresh 450 KB of external memory and a copy of the prompt per trajectory.
    this.context = idColumn(this.promptIds.length + Math.max(1024, this.promptIds.length >> 2));
    this.context.append(this.promptIds);
    // With the tools as every render of this ledger gets them (TokenWork escapes them, see escapeTools).
    this.closing = probeAssistantClosing(options.template, escapeTools(this.tokenizer, this.tools));
  }

  /** A ledger whose prompt is rendered and tokenized through `options.work` (on a thread when long). */
  static async create(options: TokenLedgerOptions, signal?: AbortSignal): Promise<TokenLedger> {
    if (options.messages.length === 0) throw RolloutError.invalid('messages', 'a conversation needs a first message');
    const work = options.work ?? TokenWork.inline(options.tokenizer, options.template);
    const prepared = { ...options };
    preparedPrompts.set(prepared, await work.promptIds(options.messages, options.tools, signal, 0, options.promptKeyHint));
    return new TokenLedger(prepared);
  }

  /** Tokens in the response so far (sampled and environment). */
  private get responseLength(): number {
    return this.context.length - this.promptIds.length;
  }

  /** Tokens in the engine's context: prompt + response. */
  get totalTokens(): number {
    return this.context.length;
  }

  /**
   * How often each way of finding the between-turns text was used (see DeltaMethod). `anchor` is Qwen3's normal
   * path; `isolated` means the template could not be diffed, worth a look when it shows up in metrics.
   */
  get deltaMethods(): Readonly<Record<DeltaMethod, number>> {
    return { ...this.methods };
  }

  /** The conversation so far (a copy): assistant contents are decoded from the sampled ids. */
  get messages(): ChatMessage[] {
    return this.history.map((m) => ({ ...m }));
  }

  /**
   * The ids to send to the engine for the next assistant turn (prompt + response), with their JSON attached for the
   * engine client (prompt-json.ts): a read-only view of the ledger's own context column, which only ever grows at
   * its end, so the view never changes (copy it with `Array.from` to keep a number[]). Neither the ids nor their JSON
   * are built again each turn: the column holds every id as it is appended, and the JSON kept in pieces is extended
   * with the ids added since the last call.
   *
   * Why a typed array: a 64K-token context as a number[] was copied from the prompt and grown by reallocation once
   * per trajectory — two half-megabyte arrays on the V8 heap each time, which made young collections more frequent
   * and slower; a typed array's elements are off the heap.
   */
  contextIds(): Int32Array {
    const { context } = this;
    const { pieces } = this.serialized;
    const promptJson = this.serialized.count === 0 ? attachedIdsJson(this.promptIds) : undefined;
    if (promptJson?.length === 1 && this.promptIds.length > 0) {
      // The prompt's JSON came with its ids from the token thread that tokenized it (a long prompt): not built here.
      pieces.push(innerPiece(promptJson[0]!));
      this.serialized.count = this.promptIds.length;
    }
    if (context.length > this.serialized.count) {
      // JSON.stringify of the new ids without the brackets (5x faster than join(',') on V8).
      const fresh = JSON.stringify(context.toArray(this.serialized.count));
      pieces.push(`${this.serialized.count === 0 ? '' : ','}${fresh.slice(1, -1)}`);
      this.serialized.count = context.length;
    }
    const view = context.view();
    attachIdsJson(view, ['[', ...pieces, ']']);
    return view;
  }

  /**
   * Records an engine completion: ids verbatim with mask 1 and the engine's logprobs, an assistant span, and an
   * assistant message decoded from the ids (a trailing stop token is not part of the content).
   *
   * After a completion that ended "abort", the next completion continues the same assistant message: it asks for
   * the rest with the partial tokens in its context, so its ids follow them in the response as a new span marked
   * `continuesTurn` (with its own backend, versions and finish reason), and the message is decoded from all the
   * message's spans together — never span by span, since a multi-byte character can straddle the cut.
   *
   * @returns the decoded content of the whole message so far, for the tool-call parser.
   */
  appendSampled(turn: SampledTurn): string {
    const continues = this.continuesMessage();
    if (!continues) this.expect('awaiting_sample', 'appendSampled');
    if (turn.tokenIds.length !== turn.logprobs.length) {
      throw new RolloutError(
        'backend_error',
        `engine returned ${turn.tokenIds.length} token ids but ${turn.logprobs.length} logprobs`,
      );
    }
    if (!turn.tokenIds.every((id) => Number.isInteger(id) && id >= 0 && id <= MAX_TOKEN_ID)) {
      throw new RolloutError('backend_error', 'engine returned a token id that is not a non-negative int32');
    }
    if (turn.logprobs.some((p) => Number.isNaN(p))) throw new RolloutError('backend_error', 'engine returned a NaN logprob');
    const start = this.responseLength;
    if (!continues) this.messageStart = start;
    this.context.append(turn.tokenIds);
    this.mask.fill(1, turn.tokenIds.length);
    this.logprobs.append(turn.logprobs);
    const messageIds = this.context.toArray(this.promptIds.length + this.messageStart);
    const lastId = messageIds.at(-1);
    const stopped = lastId !== undefined && this.tokenizer.stopTokenIds.includes(lastId);
    const contentIds = stopped ? messageIds.slice(0, -1) : messageIds;
    this.lastStopText = stopped ? this.tokenizer.decode([lastId]) : undefined;
    const content = this.tokenizer.decode(contentIds);
    // Sampled text is the policy's own: rendered as is (the template may parse its <think>), never re-tokenized.
    if (continues) {
      this.history[this.history.length - 1] = { role: 'assistant', content };
      this.rendered[this.rendered.length - 1] = { role: 'assistant', content };
    } else {
      this.history.push({ role: 'assistant', content });
      this.rendered.push({ role: 'assistant', content });
    }
    this.turns.push({
      role: 'assistant',
      start,
      end: this.responseLength,
      backend: turn.backend,
      policyVersion: turn.policyVersion,
      policyVersionStart: turn.policyVersionStart ?? turn.policyVersion,
      finishReason: turn.finishReason,
      ...(turn.logprobsMode !== undefined && { logprobsMode: turn.logprobsMode }),
      ...(continues && { continuesTurn: true }),
    });
    this.state = 'awaiting_environment';
    return content;
  }

  /** The ids sampled so far for the assistant message under way (all its spans; empty before the first). */
  messageIds(): number[] {
    return this.turns.at(-1)?.role === 'assistant' ? this.context.toArray(this.promptIds.length + this.messageStart) : [];
  }

  /** The last span is an assistant span whose request was aborted: the next completion continues its message. */
  private continuesMessage(): boolean {
    const last = this.turns.at(-1);
    return this.state === 'awaiting_environment' && last?.role === 'assistant' && last.finishReason === 'abort';
  }

  /**
   * Records the environment's answer to the last assistant turn with mask 0 and logprob 0: the part of the
   * assistant turn's closing the model did not sample (all of it after a length stop), the new messages as the
   * template renders them, and the next generation prompt. The span is a 'tool' turn when a tool message is
   * among `messages`, else a 'user' turn.
   *
   * The messages' contents are environment text: added-token strings in them (a tool printing "<|im_end|>")
   * become plain-text tokens, so the span's control tokens are exactly the template's (see opaque-content.ts).
   *
   * The text is found from a bounded suffix of the conversation when the template is suffix-local, else from the
   * whole of it (suffix-delta.ts), and rendered and tokenized through the ledger's TokenWork (on a thread when
   * large). Until the returned promise settles the ledger accepts no other call; on failure nothing was appended
   * and the call may be retried. An abort of `signal` fails the call with its reason.
   */
  async appendEnvironment(messages: readonly ChatMessage[], meta: EnvironmentMeta = {}, signal?: AbortSignal): Promise<boolean> {
    this.expect('awaiting_environment', 'appendEnvironment');
    if (messages.length === 0) throw RolloutError.invalid('messages', 'at least one environment message is needed');
    if (messages.some((m) => m.role === 'assistant')) {
      throw RolloutError.invalid('messages', 'assistant turns are sampled, not appended by the environment');
    }
    const added = messages.map((m) => ({ ...m }));
    const escaped = added.map((m) => escapeMessage(this.tokenizer, m));
    this.state = 'appending_environment';
    let delta: { ids: number[]; method: DeltaMethod };
    try {
      delta = await this.work.environmentIds(
        { history: this.rendered, added: escaped, tools: this.tools, closing: this.closing, stopText: this.lastStopText },
        signal,
      );
    } catch (err) {
      if (this.state === 'appending_environment') this.state = 'awaiting_environment';
      throw err;
    }
    this.expect('appending_environment', 'appendEnvironment');
    if (meta.maxTotalTokens !== undefined && this.context.length + delta.ids.length > meta.maxTotalTokens) {
      this.state = 'awaiting_environment';
      return false;
    }
    this.methods[delta.method]++;
    const start = this.responseLength;
    this.context.append(delta.ids);
    this.mask.fill(0, delta.ids.length);
    this.logprobs.fill(0, delta.ids.length);
    const turn: LedgerTurn = { role: added.some((m) => m.role === 'tool') ? 'tool' : 'user', start, end: this.responseLength };
    if (meta.toolName !== undefined) turn.toolName = meta.toolName;
    if (meta.toolOutcome !== undefined) turn.toolOutcome = meta.toolOutcome;
    this.turns.push(turn);
    this.history.push(...added);
    this.rendered.push(...escaped);
    this.state = 'awaiting_sample';
    return true;
  }

  /**
   * Ends the record and returns it; later appends fail, finish() again returns the same record. The last
   * assistant turn is left as sampled: its missing closing (e.g. <|im_end|> after a length stop) is not
   * appended, because those tokens would be mask 0, teach nothing, and the engine never saw them. Finishing
   * after appendEnvironment leaves the environment's turn, generation prompt included, as the last span.
   */
  finish(): LedgerSnapshot {
    this.state = 'finished';
    return this.snapshot();
  }

  /** A copy of the record so far, verified against the invariants. */
  snapshot(): LedgerSnapshot {
    const versions = this.turns.flatMap((t) => [t.policyVersion, t.policyVersionStart].filter((v): v is number => v !== undefined));
    const snapshot: LedgerSnapshot = {
      // Shared, not copied: the prompt ids are never changed (the ledger's, and the prompt cache's for a group).
      promptIds: this.promptIds,
      responseIds: this.context.toArray(this.promptIds.length),
      mask: this.mask.toArray(),
      logprobs: this.logprobs.toArray(),
      turns: this.turns.map((t) => ({ ...t })),
      messages: this.messages,
      policyVersionMin: versions.length === 0 ? 0 : Math.min(...versions),
      policyVersionMax: versions.length === 0 ? 0 : Math.max(...versions),
      totalTokens: this.totalTokens,
    };
    verifyLedgerSnapshot(snapshot);
    return snapshot;
  }

  private expect(state: LedgerState, operation: string): void {
    if (this.state !== state) {
      throw new RolloutError('failed_precondition', `${operation} is not allowed while the ledger is ${this.state}`);
    }
  }
}
