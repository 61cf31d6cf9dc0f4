import { performance } from 'node:perf_hooks';
import { describe, expect, it } from 'vitest';
import { JinjaChatTemplate, renderTimeLimitMs } from '../../src/tokens/chat-template.js';

/**
 * A render's time bound is there to stop a template that runs away (burns the thread's CPU), not a render whose thread
 * was off the CPU: token threads run below the event loop's priority (thread-priority.ts), so on a machine whose
 * cores are taken (engines, sandboxes, a trainer) a token thread waits for a core in the middle of a render, by design
 * — and a wall-clock bound then failed a sound render with internal "a runaway loop in the model's chat template?",
 * so the same conversation failed on a token thread and passed inline.
 *
 * The stand-in for being descheduled: a template function that blocks its thread without using CPU (Atomics.wait), as
 * the scheduler's wait for a core does.
 */
function offCpu(ms: number): () => string {
  const cell = new Int32Array(new SharedArrayBuffer(4));
  return () => {
    Atomics.wait(cell, 0, 0, ms);
    return '';
  };
}

/** Interpreter work after the pause, so the bound is checked again (every 512 steps, and at each range()). */
const AFTER_PAUSE = '{{ off_cpu() }}{%- for m in messages %}{%- for i in range(3000) %}{%- set x = i %}{%- endfor %}<|{{ m.role }}|>{{ m.content }}{%- endfor %}';
const RUNAWAY_AFTER_PAUSE = '{{ off_cpu() }}{%- for a in range(3000) %}{%- for b in range(3000) %}{%- set x = a %}{%- endfor %}{%- endfor %}';

describe('a chat template render whose thread is off the CPU longer than the bound', () => {
  const messages = [{ role: 'user' as const, content: 'hi' }];

  it.runIf(process.platform === 'linux')('completes: the bound counts the CPU time the render used, not the time its thread waited', () => {
    const limit = renderTimeLimitMs(messages);
    const template = new JinjaChatTemplate(AFTER_PAUSE, { variables: { off_cpu: offCpu(limit + 150) } });
    const started = performance.now();
    expect(template.render(messages, { addGenerationPrompt: false })).toBe('<|user|>hi');
    expect(performance.now() - started).toBeGreaterThan(limit);
  });

  it('still stops a template that runs away after such a wait, with internal, once its CPU time passes the bound', () => {
    const limit = renderTimeLimitMs(messages);
    const template = new JinjaChatTemplate(RUNAWAY_AFTER_PAUSE, { variables: { off_cpu: offCpu(limit + 150) } });
    const started = performance.now();
    expect(() => template.render(messages, { addGenerationPrompt: false })).toThrow(
      expect.objectContaining({ code: 'internal', message: expect.stringContaining(`ran past its ${Math.round(limit)} ms bound`) }),
    );
    // The wait and the bound's worth of CPU, never past 4 bounds of wall-clock time (plus the time to the next check).
    expect(performance.now() - started).toBeLessThan(4 * limit + 1_000);
  });

  it('stops a render that keeps waiting, whatever CPU time it used, at 4 bounds of wall-clock time', () => {
    const limit = renderTimeLimitMs(messages);
    // 100 waits of 100 ms with almost no CPU between them: 10 s if nothing stopped it.
    const template = new JinjaChatTemplate('{%- for i in range(100) %}{{ off_cpu() }}{%- for j in range(10) %}{%- endfor %}{%- endfor %}', {
      variables: { off_cpu: offCpu(100) },
    });
    const started = performance.now();
    expect(() => template.render(messages, { addGenerationPrompt: false })).toThrow(expect.objectContaining({ code: 'internal' }));
    const took = performance.now() - started;
    expect(took).toBeGreaterThanOrEqual(limit);
    expect(took).toBeLessThan(4 * limit + 1_000);
  });
});
