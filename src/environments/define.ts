import { z } from 'zod';
import { RolloutError } from '../errors.js';
import type { SandboxRequest } from '../sandboxes/spec.js';
import type { ChatMessage } from '../tokens/types.js';
import { defaultToolRegistry, type ToolRegistry } from '../tools/registry.js';
import type { Tool } from '../tools/types.js';
import type { Environment, EnvironmentContext, Evaluation, EvaluationContext, StageTimeouts } from './types.js';

/**
 * What a plugin author writes: the environment's name and description, its instance as a zod schema, and the
 * hooks. {@link defineEnvironment} turns it into an {@link Environment}: the schema validates instances (errors
 * name the field) and is what ListEnvironments shows as JSON Schema, so the two never drift.
 *
 * `S`'s output type is what every hook receives: a schema with defaults or transforms hands the hooks the
 * cleaned-up instance, while ListEnvironments describes what a trainer may send (the schema's input side).
 */
export interface EnvironmentDefinition<S extends z.ZodType> {
  /** Registry key, the TaskSpec's `environment`: letters, digits, `-`, `_`, `.`. */
  name: string;
  /** One or two sentences for ListEnvironments: what a task is and how it is scored. */
  description: string;
  /**
   * The instance. Unknown keys are dropped by a plain `z.object` (dataset rows carry extra columns such as id or
   * level); use `z.strictObject` to reject them instead.
   */
  instance: S;
  /**
   * The sandbox of one instance (image, network, mounts, env, limits), or one request for every instance.
   * Omitted: the server's configured sandbox, without network. `network: true` is a NAT'ed namespace with the host's
   * loopback cut off (bubblewrap, `sandbox.networkMode` 'isolated', the default), or the host's own network namespace,
   * loopback services included (`networkMode` 'host', and Apptainer): see SandboxSpec.network and README, Sandboxes.
   */
  sandbox?: SandboxRequest | ((instance: z.output<S>) => SandboxRequest);
  /**
   * The first messages, when they depend on the instance alone: the server then measures the prompt at
   * admission, and `init` defaults to returning it. Must not throw for a valid instance.
   */
  prompt?: (instance: z.output<S>) => ChatMessage[];
  /**
   * Sets the sample up (files in the sandbox, a service to start) and returns the first messages. Optional when
   * `prompt` is given (then it returns `prompt(instance)`). A throw is ENVIRONMENT_ERROR, never reward 0.
   */
  init?: (context: EnvironmentContext<z.output<S>>) => Promise<{ messages: ChatMessage[] }>;
  /**
   * The model's tools. An array is built once and shared by every sample: entries are Tool objects (e.g. from
   * `defineTool`) or names of the tool registry's tools ('python', 'bash', 'str_replace_editor', 'finish'); such
   * shared tools must keep no per-sample state and have no `dispose`. A function is called once per sample,
   * for tools with per-sample state (each may implement `dispose`). Omitted: no tools.
   */
  tools?: ReadonlyArray<Tool | string> | ((instance: z.output<S>) => Tool[]);
  /** With a `tools` function: the names it returns, for ListEnvironments (an array declares them itself). */
  toolNames?: readonly string[];
  /** Stage budgets this environment needs when a task does not set them (see `Environment.stageTimeouts`). */
  stageTimeouts?: StageTimeouts;
  /** Where tool names in `tools` come from (default: the built-in tool registry). */
  toolRegistry?: ToolRegistry;
  /**
   * The episode's reward, finite numeric details and a JSON report. The model's failure (a wrong answer, no
   * answer, code that crashes) is a reward, usually 0; a throw means the evaluation itself failed and becomes
   * ENVIRONMENT_ERROR (SANDBOX_ERROR when the sandbox failed), so trainers can drop it. `openSandbox` gives a fresh
   * sandbox from the image for grading, untouched by the episode (the pipeline stops it; see `OpenSandbox`).
   */
  evaluate: (context: EvaluationContext<z.output<S>>) => Promise<Evaluation>;
}

/**
 * Builds an environment plugin from a zod instance schema and hooks. Validation errors become
 * `RolloutError.invalid('instance.<path>', reason)` — "required" for a missing field, zod's message otherwise —
 * which the server reports as a rejected task naming the field. For a `z.union`, the branch the instance
 * resembles most (fewest of its required top-level fields missing, then fewest problems) explains the error.
 *
 * @example
 * const echo = defineEnvironment({
 *   name: 'echo',
 *   description: 'Say the word back.',
 *   instance: z.object({ word: z.string().min(1) }),
 *   prompt: ({ word }) => [{ role: 'user', content: `Say "${word}".` }],
 *   tools: ['finish'],
 *   evaluate: async ({ instance, outcome }) => {
 *     const correct = outcome.finishAnswer === instance.word ? 1 : 0;
 *     return { reward: correct, details: { correct }, report: { said: outcome.finishAnswer ?? null } };
 *   },
 * });
 */
export function defineEnvironment<S extends z.ZodType>(definition: EnvironmentDefinition<S>): Environment<z.output<S>> {
  type I = z.output<S>;
  const { name, instance: schema, prompt, init, evaluate } = definition;
  if (!prompt && !init) throw new RolloutError('invalid_argument', `environment "${name}": give init, prompt, or both`);
  const instanceSchema = instanceJsonSchema(schema, name);
  const { tools, toolNames } = resolveTools(definition);
  const sandbox = definition.sandbox;
  return {
    name,
    description: definition.description,
    instanceSchema,
    ...(toolNames && { toolNames }),
    ...(definition.stageTimeouts && { stageTimeouts: definition.stageTimeouts }),
    validate: (instance: unknown): I => parseInstance(schema, instance),
    ...(sandbox !== undefined && { sandbox: typeof sandbox === 'function' ? sandbox : () => sandbox }),
    ...(prompt && { prompt }),
    init: init ?? (async ({ instance }) => ({ messages: prompt!(instance) })),
    tools,
    evaluate,
  };
}

/**
 * Validates `value` against `schema` and returns its output; throws RolloutError.invalid naming the first field
 * that is wrong (`instance` itself when it is not even the right type). Exported for loaders that check dataset
 * rows before submitting them.
 */
export function parseInstance<S extends z.ZodType>(schema: S, value: unknown, root = 'instance'): z.output<S> {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const issue = explainingIssue(result.error.issues, value);
  const path = issue.path.map(String);
  const field = [root, ...path].join('.');
  const missing = path.length > 0 && valueAt(value, issue.path) === undefined && issue.code === 'invalid_type';
  throw RolloutError.invalid(field, missing ? 'required' : issue.message);
}

/** The instance schema as JSON Schema (draft 2020-12) of what a trainer may send. */
function instanceJsonSchema(schema: z.ZodType, name: string): Record<string, unknown> {
  try {
    return z.toJSONSchema(schema, { io: 'input', unrepresentable: 'any' }) as Record<string, unknown>;
  } catch (err) {
    throw new RolloutError('invalid_argument', `environment "${name}": its instance schema has no JSON Schema form`, { cause: err });
  }
}

function resolveTools<S extends z.ZodType>(definition: EnvironmentDefinition<S>): { tools: (instance: z.output<S>) => Tool[]; toolNames?: readonly string[] } {
  const given = definition.tools ?? [];
  if (typeof given === 'function') return { tools: given, ...(definition.toolNames && { toolNames: definition.toolNames }) };
  const registry = definition.toolRegistry ?? defaultToolRegistry();
  const shared = given.map((tool) => (typeof tool === 'string' ? registry.create([tool])[0]! : tool));
  const disposable = shared.find((tool) => typeof tool.dispose === 'function');
  if (disposable) {
    throw new RolloutError('invalid_argument', `environment "${definition.name}": tool "${disposable.name}" has dispose(), so it cannot be shared; give tools as a function`);
  }
  // One array for every sample: the chat template's tool schemas are then computed once (toolSchemas caches by array).
  return { tools: () => shared, toolNames: shared.map((tool) => tool.name) };
}

type Issue = z.core.$ZodIssue;

/** The issue to report: the first one, looking inside a union at the branch the value resembles most. */
function explainingIssue(issues: readonly Issue[], value: unknown): Issue {
  const first = issues[0];
  if (!first) return { code: 'custom', path: [], message: 'invalid', input: value } as Issue;
  if (first.code !== 'invalid_union' || first.errors.length === 0) return first;
  const at = valueAt(value, first.path);
  const score = (branch: readonly Issue[]): [number, number] => [
    branch.filter((i) => i.path.length > 0 && valueAt(at, i.path.slice(0, 1)) === undefined).length,
    branch.length,
  ];
  let best = first.errors[0]!;
  for (const branch of first.errors.slice(1)) {
    const [missingA, countA] = score(branch);
    const [missingB, countB] = score(best);
    if (missingA < missingB || (missingA === missingB && countA < countB)) best = branch;
  }
  const inner = explainingIssue(best, at);
  return { ...inner, path: [...first.path, ...inner.path] } as Issue;
}

function valueAt(value: unknown, path: readonly PropertyKey[]): unknown {
  let current = value;
  for (const key of path) {
    if (typeof current !== 'object' || current === null) return undefined;
    current = (current as Record<PropertyKey, unknown>)[key];
  }
  return current;
}
