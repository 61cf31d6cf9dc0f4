import { describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { EnvironmentRegistry, defaultRegistry } from '../../src/environments/registry.js';
import type { Environment } from '../../src/environments/types.js';

function env(name: string, toolNames?: readonly string[]): Environment<{ text: string }> {
  return {
    name,
    description: `the ${name} environment`,
    instanceSchema: { type: 'object' },
    ...(toolNames ? { toolNames } : {}),
    validate: (x) => x as { text: string },
    init: async ({ instance }) => ({ messages: [{ role: 'user', content: instance.text }] }),
    tools: () => [],
    evaluate: async () => ({ reward: 1, details: {}, report: {} }),
  };
}

describe('EnvironmentRegistry', () => {
  it('finds registered environments by name', () => {
    const echo = env('echo');
    const registry = new EnvironmentRegistry().register(echo);
    expect(registry.get('echo')).toBe(echo);
    expect(registry.has('echo')).toBe(true);
    expect(registry.has('other')).toBe(false);
  });

  it('rejects an unknown name with the known ones, as an invalid "environment" field', () => {
    const registry = new EnvironmentRegistry().register(env('b')).register(env('a'));
    try {
      registry.get('x');
      expect.unreachable();
    } catch (err: unknown) {
      expect(err).toBeInstanceOf(RolloutError);
      expect(err).toMatchObject({ code: 'invalid_argument', field: 'environment', message: 'environment: unknown environment "x"; known: a, b' });
    }
  });

  it("refuses stage budgets a timer cannot hold (Node would fire them after 1 ms), naming the environment and the key", () => {
    const registry = new EnvironmentRegistry();
    for (const [i, bad] of [0, -5, 1.5, 2 ** 31, Number.NaN].entries()) {
      expect(() => registry.register({ ...env(`e${i}`), stageTimeouts: { runMs: bad } })).toThrow(/stageTimeouts\.runMs must be a whole number of ms from 1 to 2147483647/);
    }
    registry.register({ ...env('ok'), stageTimeouts: { initMs: 1, runMs: 2 ** 31 - 1 } });
    expect(registry.has('ok')).toBe(true);
  });

  it('refuses duplicate and malformed names', () => {
    const registry = new EnvironmentRegistry().register(env('a'));
    expect(() => registry.register(env('a'))).toThrow(expect.objectContaining({ code: 'already_exists' }));
    expect(() => registry.register(env('has space'))).toThrow(RolloutError);
    expect(() => registry.register(env(''))).toThrow(RolloutError);
  });

  it('lists environments sorted by name with schema and tool names', () => {
    const registry = new EnvironmentRegistry().register(env('zeta', ['bash'])).register(env('alpha'));
    expect(registry.list()).toEqual([
      { name: 'alpha', description: 'the alpha environment', instanceSchema: { type: 'object' }, tools: [] },
      { name: 'zeta', description: 'the zeta environment', instanceSchema: { type: 'object' }, tools: ['bash'] },
    ]);
  });
});

describe('defaultRegistry', () => {
  it('holds the built-in math environment with python and finish tools', () => {
    const registry = defaultRegistry();
    const math = registry.list().find((e) => e.name === 'math');
    expect(math).toMatchObject({ name: 'math', tools: ['python', 'bash', 'finish'] });
    expect(math!.instanceSchema).toMatchObject({ type: 'object', required: ['problem', 'answer'] });
    const instance = registry.get('math').validate({ problem: '1+1?', answer: 2 });
    expect(registry.get('math').tools(instance).map((t) => t.name)).toEqual(['python', 'bash', 'finish']);
  });

  it('holds the code, stem and swe environments too, each with an instance JSON Schema and its tools', () => {
    const list = defaultRegistry().list();
    expect(list.map((e) => e.name)).toEqual(['code', 'math', 'stem', 'swe']);
    expect(list[0]).toMatchObject({ tools: ['python', 'bash', 'finish'], instanceSchema: { anyOf: [expect.objectContaining({ required: ['prompt', 'test', 'entry_point'] }), expect.objectContaining({ required: ['tests'] })] } });
    expect(list[2]).toMatchObject({ tools: ['python', 'finish'], instanceSchema: { type: 'object', required: ['question', 'answer'] } });
  });
});
