import { RolloutError } from '../errors.js';
import type { ToolSchema } from '../tokens/types.js';
import { createBashTool } from './bash-tool.js';
import { createEditorTool } from './editor-tool.js';
import { createFinishTool } from './finish-tool.js';
import { createPythonTool } from './python-tool.js';
import type { Tool } from './types.js';

/** Makes a fresh tool instance (tools may keep per-trajectory state, e.g. a cell counter). */
export type ToolFactory = () => Tool;

/**
 * Tool factories by name, so environments can ask for tools by name ("python", "finish") and deployments can
 * add their own. Why factories and not instances: each trajectory gets its own tool objects.
 *
 * @example
 * const registry = defaultToolRegistry().register('echo', () => myEchoTool);
 * const tools = registry.create(['python', 'echo', 'finish']);
 */
export class ToolRegistry {
  private readonly factories = new Map<string, ToolFactory>();

  register(name: string, factory: ToolFactory): this {
    if (this.factories.has(name)) throw new RolloutError('already_exists', `tool ${name} is already registered`);
    this.factories.set(name, factory);
    return this;
  }

  has(name: string): boolean {
    return this.factories.has(name);
  }

  names(): string[] {
    return [...this.factories.keys()];
  }

  /** New instances of the named tools, in the given order; an unknown name is an invalid_argument. */
  create(names: readonly string[]): Tool[] {
    return names.map((name) => {
      const factory = this.factories.get(name);
      if (!factory) throw RolloutError.invalid('tools', `unknown tool ${name}; registered: ${this.names().join(', ')}`);
      return factory();
    });
  }
}

/**
 * The built-in tools: `python` (10 s per call), `bash` (the sandbox's persistent shell, 30 s per command),
 * `str_replace_editor` (view/create/str_replace/insert/undo_edit through the sandbox's file API) and `finish`.
 */
export function defaultToolRegistry(): ToolRegistry {
  return new ToolRegistry()
    .register('python', () => createPythonTool())
    .register('bash', () => createBashTool())
    .register('str_replace_editor', () => createEditorTool())
    .register('finish', () => createFinishTool());
}

/** The tools' descriptions in the OpenAI function form the chat template's `tools` variable expects. */
export function toolSchemas(tools: readonly Tool[]): readonly ToolSchema[] {
  // The same array for the same tools: an environment that builds its tools once gets one schema list, which
  // the chat template and ledger caches then recognise on every render of every trajectory.
  let schemas = schemaCache.get(tools);
  if (!schemas) {
    schemas = Object.freeze(
      tools.map((tool) => ({
        type: 'function' as const,
        function: { name: tool.name, description: tool.description, parameters: tool.parameters },
      })),
    );
    schemaCache.set(tools, schemas);
  }
  return schemas;
}

const schemaCache = new WeakMap<readonly Tool[], readonly ToolSchema[]>();
