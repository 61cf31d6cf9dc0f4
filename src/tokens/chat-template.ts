import { readFileSync } from 'node:fs';
import { Environment, Interpreter, Template } from '@huggingface/jinja';
import { RolloutError } from '../errors.js';
import { specialTokenString, type TokenizerConfig } from './model-files.js';
import type { ChatMessage, ChatTemplate, ToolSchema } from './types.js';

/** Options of {@link JinjaChatTemplate}. */
export interface JinjaChatTemplateOptions {
  /** bos_token, eos_token, pad_token, unk_token as the template sees them (missing ones render as ""). */
  specialTokens?: Partial<Record<'bos_token' | 'eos_token' | 'pad_token' | 'unk_token', string>>;
  /**
   * Extra template variables, e.g. `{ enable_thinking: false }` for Qwen3. They cannot override `messages`,
   * `tools` or `add_generation_prompt`.
   */
  variables?: Record<string, unknown>;
}

/**
 * A chat template executed with @huggingface/jinja, the JavaScript port of the Jinja subset that transformers'
 * `apply_chat_template` uses. We render the model's own template instead of hand-writing its format, so a new
 * model needs no code, only its tokenizer_config.json.
 *
 * Variables follow transformers: `messages` (plain {role, content, name?} objects), `tools` (the OpenAI function
 * schemas, or `none` when there are none: templates test `if tools` / `tools is not none`),
 * `add_generation_prompt`, and the special-token strings. `raise_exception` from the template becomes an
 * `invalid_argument` RolloutError, since it means the conversation has a shape the model does not accept.
 *
 * Rendering is pure: the same arguments always give the same string (the ledger relies on this to diff renders);
 * `strftime_now()` reports one fixed time per process for that reason ({@link templateClockMs}).
 *
 * A template is a program, run on the event loop for small renders: each render is bounded in time
 * ({@link renderTimeLimitMs}; past it, `internal`, see {@link isRenderOverrun}) and `range()` in size
 * ({@link MAX_RANGE_ITEMS}), so a runaway template fails its sample instead of blocking the server.
 *
 * @example
 * const template = JinjaChatTemplate.fromConfig(config, { variables: { enable_thinking: false } });
 * template.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: true });
 */
export class JinjaChatTemplate implements ChatTemplate {
  private readonly template: Template;
  private readonly fixed: Record<string, unknown>;

  /** @param source the Jinja source, e.g. tokenizer_config.json's `chat_template`. */
  constructor(
    readonly source: string,
    options: JinjaChatTemplateOptions = {},
  ) {
    try {
      this.template = new Template(source);
    } catch (err) {
      throw new RolloutError('failed_precondition', `chat template does not parse: ${describe(err)}`, { cause: err });
    }
    const tokens = options.specialTokens ?? {};
    this.fixed = {
      bos_token: tokens.bos_token ?? '',
      eos_token: tokens.eos_token ?? '',
      pad_token: tokens.pad_token ?? '',
      unk_token: tokens.unk_token ?? '',
      ...options.variables,
    };
  }

  /** The template of a tokenizer_config.json with its special tokens; `failed_precondition` when it has none. */
  static fromConfig(
    config: TokenizerConfig,
    source: string | undefined,
    variables?: Record<string, unknown>,
  ): JinjaChatTemplate {
    if (source === undefined) throw new RolloutError('failed_precondition', 'the tokenizer has no chat_template');
    const specialTokens: NonNullable<JinjaChatTemplateOptions['specialTokens']> = {};
    for (const key of ['bos_token', 'eos_token', 'pad_token', 'unk_token'] as const) {
      const value = specialTokenString(config[key]);
      if (value !== undefined) specialTokens[key] = value;
    }
    return new JinjaChatTemplate(source, variables === undefined ? { specialTokens } : { specialTokens, variables });
  }

  render(
    messages: readonly ChatMessage[],
    options: { addGenerationPrompt: boolean; tools?: readonly ToolSchema[] },
  ): string {
    const tools = options.tools !== undefined && options.tools.length > 0 ? plainTools(options.tools) : null;
    const limitMs = renderTimeLimitMs(messages);
    const outer = budget;
    const startedAt = performance.now();
    budget = { startedAt, endsAt: startedAt + limitMs, limitMs, steps: STEPS_BETWEEN_CHECKS, cpuAtFirstCheck: undefined };
    try {
      return this.template.render({
        ...this.fixed,
        messages: messages.map(plainMessage),
        tools,
        add_generation_prompt: options.addGenerationPrompt,
      });
    } catch (err) {
      if (err instanceof RenderOverrun) throw new RolloutError('internal', err.message, { cause: err });
      throw new RolloutError('invalid_argument', `chat template failed: ${describe(err)}`, {
        cause: err,
        field: 'messages',
      });
    } finally {
      budget = outer;
    }
  }
}

/**
 * How long one render may take, ms: 250 ms plus 10 µs per character of the messages' contents. A real template
 * renders at well under 1 µs per character (a 2,048-character render on the event loop takes about a millisecond),
 * so only a template in a runaway loop (a bug, or a hostile one, possibly triggered by content) reaches it; without
 * a bound such a render blocked the event loop (every gRPC stream and engine request) forever, since small renders
 * run there with no pool deadline around them.
 *
 * The bound is on the CPU time the render uses, where the thread's own CPU time can be read (Linux), not on the time
 * it takes: a token thread runs below the event loop's priority (thread-priority.ts), so on a machine whose cores
 * are all taken it waits for one in the middle of a render, by design, and a sound render then ran past a wall-clock
 * bound and failed its sample as a "runaway" template (one that passed inline). The clock is still what is checked
 * every few hundred steps; the thread's CPU time is read only once the clock says the bound has passed (and, to count
 * from, at most every 50 ms: a bound may be cut by that much CPU time), and a render is never let run past
 * {@link MAX_WAIT_FACTOR} times its bound however little CPU it got.
 */
export function renderTimeLimitMs(messages: readonly ChatMessage[]): number {
  let chars = 0;
  for (const m of messages) chars += m.content.length;
  return 250 + chars / 100;
}

/**
 * Most items a template's `range()` may make: Python's range is lazy, this port's an array (range(10**9) would fill the
 * heap), and a for loop over one first builds a scope per item without an interpreter step (~1 µs each, unchecked). Chat
 * templates range over messages.
 */
export const MAX_RANGE_ITEMS = 100_000;

/**
 * The time bound of the render under way on this thread (renders are synchronous; a nested one keeps the outer's
 * to restore). Checked every STEPS_BETWEEN_CHECKS interpreter steps, so a step costs a decrement, not a clock read.
 */
let budget: RenderBudget | undefined;
const STEPS_BETWEEN_CHECKS = 512;

/** The bound of one render (see {@link renderTimeLimitMs}). */
interface RenderBudget {
  startedAt: number;
  /** When the clock says the bound has passed (moved on while the render has used less CPU than its bound). */
  endsAt: number;
  limitMs: number;
  /** Interpreter steps to the next check. */
  steps: number;
  /** The thread's CPU time at the render's first check, ms; null where it cannot be read (the clock alone bounds). */
  cpuAtFirstCheck: number | null | undefined;
}

/**
 * The longest a render may take, as a multiple of its bound, when the thread was off the CPU for much of it: beyond,
 * it stops whatever its CPU time says, so a runaway render on the event loop never holds it more than this (CPU time a
 * kernel does not count must not let one go on forever). 4: a render uses a tenth of its bound or less, so a thread
 * that gets 2.5% of a core (below normal priority beside four busy threads of normal priority per core) still ends.
 */
const MAX_WAIT_FACTOR = 4;

/** A render stopped at its time bound (turned into an `internal` RolloutError by render). */
class RenderOverrun extends Error {}

/**
 * Whether `err` is a render stopped at its time bound. Probes that take a failed render for "a shape the template
 * refuses" and go on must rethrow it instead: a template that runs away on a probe content would otherwise cost
 * the bound once per probe render (dozens per turn, on the event loop) and be probed again on the next turn.
 */
export function isRenderOverrun(err: unknown): boolean {
  return err instanceof RolloutError && err.cause instanceof RenderOverrun;
}

function checkBudget(b: RenderBudget): void {
  b.steps = STEPS_BETWEEN_CHECKS;
  const now = performance.now();
  // The CPU time to count from, at the first check (a short render never needs it): the last reading of this thread's,
  // if at most BASELINE_MAX_AGE_MS old (an earlier one only counts more), so renders do not each read it.
  if (b.cpuAtFirstCheck === undefined) b.cpuAtFirstCheck = cpuBaseline(now);
  if (now <= b.endsAt) return;
  // Past the bound by the clock: a runaway template, or a thread that waited for a core. Its CPU time tells which.
  const cpu = b.cpuAtFirstCheck === null ? undefined : threadCpuMs();
  const latest = b.startedAt + MAX_WAIT_FACTOR * b.limitMs;
  if (cpu !== undefined && b.cpuAtFirstCheck !== null && now < latest) {
    const used = cpu - b.cpuAtFirstCheck;
    if (used < b.limitMs) {
      b.endsAt = Math.min(now + (b.limitMs - used), latest);
      return;
    }
  }
  throw new RenderOverrun(`chat template render ran past its ${Math.round(b.limitMs)} ms bound (a runaway loop in the model's chat template?); stopped`);
}

/**
 * This thread's last CPU time reading (see checkBudget), ms, and when it was taken (performance.now()); null once it
 * could not be read (the clock alone bounds renders then).
 */
let lastCpu: { ms: number; at: number } | null | undefined;
/** How old a reading may be to count from: a render's bound is cut by at most the CPU time used since. */
const BASELINE_MAX_AGE_MS = 50;

/** The thread's CPU time at most BASELINE_MAX_AGE_MS ago, ms; null where it cannot be read. */
function cpuBaseline(now: number): number | null {
  if (lastCpu === null) return null;
  if (lastCpu === undefined || now - lastCpu.at > BASELINE_MAX_AGE_MS) {
    const ms = threadCpuMs();
    lastCpu = ms === undefined ? null : { ms, at: now };
  }
  return lastCpu?.ms ?? null;
}

/**
 * The CPU time this thread has used, ms, from Linux's per-thread accounting (/proc/thread-self/stat: user and system
 * time in clock ticks, 100 per second); undefined elsewhere or when it cannot be read.
 */
function threadCpuMs(): number | undefined {
  if (process.platform !== 'linux') return undefined;
  try {
    const stat = readFileSync('/proc/thread-self/stat', 'latin1');
    // After the command name (in parentheses, which may itself hold spaces and parentheses): state is field 3, utime
    // and stime fields 14 and 15.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[11]) + Number(fields[12]);
    return Number.isFinite(ticks) ? ticks * 10 : undefined;
  } catch {
    return undefined;
  }
}

// Every interpreter step counts against the render's bound: @huggingface/jinja has no step hook and creates its
// Interpreter inside Template.render, so its evaluate is wrapped here, once. Outside a render of ours
// (budget undefined) it is the library's own.
const evaluate = Interpreter.prototype.evaluate;
Interpreter.prototype.evaluate = function (this: Interpreter, ...args: Parameters<Interpreter['evaluate']>) {
  const b = budget;
  if (b !== undefined && --b.steps <= 0) checkBudget(b);
  return evaluate.apply(this, args);
};

// The globals of a render of ours get a bounded range() and a strftime_now() on the template clock (Template.render
// declares the library's, and a template variable of the same name would be refused as already declared).
const set = Environment.prototype.set;
Environment.prototype.set = function (this: Environment, name: string, value: unknown) {
  if (budget !== undefined && typeof value === 'function') {
    if (name === 'range') value = boundedRange;
    else if (name === 'strftime_now') value = strftimeNow;
  }
  return set.call(this, name, value);
};

/** See {@link templateClockMs}. */
let templateClock: number | undefined;

/**
 * The time a template's `strftime_now()` reports, ms since the epoch: one time per process, the first render's (a
 * token thread takes the server's, see setTemplateClockMs). Renders must be pure: the ledger diffs renders of one
 * trajectory (a date that changed between two would shift the text under its tokens), and prompts, skeletons and probes
 * are cached by their arguments alone (a cache filled on Monday would print Monday on Tuesday while an uncached render
 * printed Tuesday). So every render of every template prints the date the server started rendering; a server that runs
 * past midnight keeps it. A template that takes a `date_string` variable (Llama 3.x) can be given one in the config.
 */
export function templateClockMs(): number {
  return (templateClock ??= Date.now());
}

/** Sets the template clock: a token thread takes the server's (createTokenPool sends it), before its first render. */
export function setTemplateClockMs(ms: number): void {
  templateClock = ms;
}

/** The library's strftime_now (Python's datetime.now().strftime subset it knows), at {@link templateClockMs}. */
function strftimeNow(format: unknown): string {
  const date = new Date(templateClockMs());
  const pad2 = (n: number): string => (n < 10 ? `0${n}` : String(n));
  return String(format).replace(/%[YmdbBHM%]/gu, (token) => {
    switch (token) {
      case '%Y':
        return String(date.getFullYear());
      case '%m':
        return pad2(date.getMonth() + 1);
      case '%d':
        return pad2(date.getDate());
      case '%b':
        return new Intl.DateTimeFormat(undefined, { month: 'short' }).format(date);
      case '%B':
        return new Intl.DateTimeFormat(undefined, { month: 'long' }).format(date);
      case '%H':
        return pad2(date.getHours());
      case '%M':
        return pad2(date.getMinutes());
      default:
        return '%';
    }
  });
}

/** The library's range(), refusing more than MAX_RANGE_ITEMS items and checking the bound as it fills. */
function boundedRange(start: number, stop?: number, step = 1): number[] {
  if (stop === undefined) {
    stop = start;
    start = 0;
  }
  if (step === 0) throw new Error('range() step must not be zero');
  const length = Math.max(0, Math.ceil((stop - start) / step));
  if (!(length <= MAX_RANGE_ITEMS)) throw new Error(`range() of ${length} items (at most ${MAX_RANGE_ITEMS})`);
  const out: number[] = [];
  for (let i = 0, v = start; i < length; i++, v += step) out.push(v);
  if (budget !== undefined) checkBudget(budget);
  return out;
}

/** Copies a message, leaving out absent fields so `message.name is defined` behaves as in Python. */
function plainMessage(message: ChatMessage): Record<string, unknown> {
  const plain: Record<string, unknown> = { role: message.role, content: message.content };
  if (message.name !== undefined) plain['name'] = message.name;
  return plain;
}

/**
 * Deep copy through JSON: the template sees plain data, and tojson prints exactly what the caller gave. Cached
 * per tools array (an environment passes the same one every turn), since this ran on every render.
 */
function plainTools(tools: readonly ToolSchema[]): unknown[] {
  let plain = plainToolsCache.get(tools);
  if (!plain) plainToolsCache.set(tools, (plain = JSON.parse(JSON.stringify(tools)) as unknown[]));
  return plain;
}

const plainToolsCache = new WeakMap<readonly ToolSchema[], unknown[]>();

function describe(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * A model's named templates as transformers picks them (PreTrainedTokenizerBase.get_chat_template, and so vLLM's
 * chat endpoint): `toolUse` ("tool_use") for a render given tools, `base` ("default") otherwise. Chosen per render
 * by its tools, which a trajectory passes the same to every render (TokenLedger's `tools`), so all of a trajectory's
 * renders come from one template; every cache of renders and probes is keyed by the tools too (tools-key.ts).
 * An empty tool list counts as none, as everywhere in this project (the template sees `tools` = none); transformers
 * would take "tool_use" for `tools=[]`.
 */
export class ToolUseChatTemplate implements ChatTemplate {
  constructor(
    readonly base: ChatTemplate,
    readonly toolUse: ChatTemplate,
  ) {}

  render(messages: readonly ChatMessage[], options: { addGenerationPrompt: boolean; tools?: readonly ToolSchema[] }): string {
    return (options.tools !== undefined && options.tools.length > 0 ? this.toolUse : this.base).render(messages, options);
  }
}
