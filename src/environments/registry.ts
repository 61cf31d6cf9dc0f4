import { RolloutError } from '../errors.js';
import { MAX_TIMER_MS } from '../timers.js';
import { defaultToolRegistry, type ToolRegistry } from '../tools/registry.js';
import { createCodeEnvironment, type CodeEnvironmentOptions } from './code/code-environment.js';
import { createMathEnvironment, type MathEnvironmentOptions } from './math/math-environment.js';
import { createSweEnvironment, type SweEnvironmentOptions } from './swe/swe-environment.js';
import { createStemEnvironment, type StemEnvironmentOptions } from './stem/stem-environment.js';
import type { Environment } from './types.js';

/** What ListEnvironments shows about one environment. */
export interface EnvironmentInfo {
  name: string;
  description: string;
  /** JSON Schema of the instance the environment accepts. */
  instanceSchema: Record<string, unknown>;
  /** Tool names offered to the model; empty when the environment does not declare them in advance. */
  tools: readonly string[];
}

/**
 * The environments a server can run, by name. TaskSpec.environment is looked up here once, at admission,
 * so a typo is rejected as INVALID_TASK with the list of known names instead of failing deep in the pipeline.
 * Registration happens at start-up; names are unique.
 *
 * @example
 * const registry = new EnvironmentRegistry().register(createMathEnvironment());
 * registry.get('math').validate({ problem: '1+1?', answer: 2 });
 */
export class EnvironmentRegistry {
  private readonly environments = new Map<string, Environment>();

  /** Adds an environment; throws RolloutError('already_exists') on a duplicate name. Returns `this` to chain. */
  register<I>(environment: Environment<I>): this {
    const name = environment.name;
    if (!/^[a-z0-9][a-z0-9_.-]*$/i.test(name)) {
      throw new RolloutError('invalid_argument', `environment name "${name}" must be alphanumeric with - _ .`);
    }
    if (this.environments.has(name)) throw new RolloutError('already_exists', `environment "${name}" is already registered`);
    for (const [key, ms] of Object.entries(environment.stageTimeouts ?? {})) {
      if (ms !== undefined && (!Number.isInteger(ms) || ms < 1 || ms > MAX_TIMER_MS)) {
        throw new RolloutError('invalid_argument', `environment "${name}": stageTimeouts.${key} must be a whole number of ms from 1 to ${MAX_TIMER_MS} (what a timer holds), got ${String(ms)}`);
      }
    }
    this.environments.set(name, environment as Environment);
    return this;
  }

  /** Whether `name` is registered. */
  has(name: string): boolean {
    return this.environments.has(name);
  }

  /** The environment called `name`; throws RolloutError.invalid('environment', …) naming the known ones. */
  get(name: string): Environment {
    const environment = this.environments.get(name);
    if (environment) return environment;
    const known = [...this.environments.keys()].sort().join(', ') || '(none)';
    throw RolloutError.invalid('environment', `unknown environment "${name}"; known: ${known}`);
  }

  /** All environments, sorted by name, as ListEnvironments reports them. */
  list(): EnvironmentInfo[] {
    return [...this.environments.values()]
      .map((e) => ({ name: e.name, description: e.description, instanceSchema: e.instanceSchema, tools: [...(e.toolNames ?? [])] }))
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }
}

/** Options of {@link defaultRegistry}: shared tools and per-environment overrides (tests inject fake tools here). */
export interface DefaultRegistryOptions {
  /** Tool factories every built-in environment takes its tools from (default: the built-in tool registry). */
  toolRegistry?: ToolRegistry;
  math?: Omit<MathEnvironmentOptions, 'toolRegistry'>;
  swe?: Omit<SweEnvironmentOptions, 'toolRegistry'>;
  stem?: Omit<StemEnvironmentOptions, 'toolRegistry'>;
  code?: Omit<CodeEnvironmentOptions, 'toolRegistry'>;
}

/** A registry holding the built-in environments: "math", "swe", "code" and "stem". */
export function defaultRegistry(options: DefaultRegistryOptions = {}): EnvironmentRegistry {
  const toolRegistry = options.toolRegistry ?? defaultToolRegistry();
  return new EnvironmentRegistry()
    .register(createMathEnvironment({ ...options.math, toolRegistry }))
    .register(createSweEnvironment({ ...options.swe, toolRegistry }))
    .register(createCodeEnvironment({ ...options.code, toolRegistry }))
    .register(createStemEnvironment({ ...options.stem, toolRegistry }));
}
