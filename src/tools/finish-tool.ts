import { z } from 'zod';
import { defineTool, type ValidatedTool } from './define-tool.js';

/**
 * The `finish` tool: the model submits its final answer and the episode ends (outcome 'finish'). Why a tool and
 * not just a plain reply: agents that work through many tool turns need an unambiguous "I am done" signal, and
 * the answer arrives as a separate string the environment can grade without parsing prose.
 */
export function createFinishTool(): ValidatedTool {
  return defineTool({
    name: 'finish',
    description: 'Submit your final answer and end the task. Call this exactly once, when you are done.',
    args: z.object({ answer: z.string().describe('Your final answer.') }),
    async run({ answer }) {
      return { output: 'Answer submitted.', outcome: 'finish', answer };
    },
  });
}
