/**
 * A complete environment plugin in ~30 lines (see README "Extending"): instance validation naming the field,
 * first messages, an in-process tool, and a reward. test/contract/plugin-environment.test.ts runs it end to end.
 */
import { z } from 'zod';
import { defineTool, RolloutError, type Environment } from '../../src/index.js';

const shout = defineTool({
  name: 'shout',
  description: 'Upper-cases its text.',
  args: z.object({ text: z.string() }),
  run: async ({ text }) => ({ output: text.toUpperCase(), outcome: 'ok' }),
});

export const echoEnvironment: Environment<{ word: string }> = {
  name: 'echo',
  description: 'Say the word back in capitals.',
  instanceSchema: { type: 'object', properties: { word: { type: 'string' } }, required: ['word'] },
  toolNames: ['shout'],
  validate: (x) => {
    const word = (x as { word?: unknown } | null)?.word;
    if (typeof word !== 'string' || !word) throw RolloutError.invalid('instance.word', 'must be a non-empty string');
    return { word };
  },
  init: async ({ instance }) => ({ messages: [{ role: 'user', content: `Shout "${instance.word}".` }] }),
  tools: () => [shout], // built once: tools keep no per-sample state
  evaluate: async ({ instance, outcome }) => {
    const said = outcome.messages.at(-1)?.content ?? '';
    const correct = said.includes(instance.word.toUpperCase()) ? 1 : 0;
    return { reward: correct, details: { correct }, report: { said } };
  },
};
