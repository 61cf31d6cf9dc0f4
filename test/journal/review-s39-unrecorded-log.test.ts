import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { createLogger } from '../../src/observability/logger.js';
import { mathTask } from '../support/harness.js';
import { startServerHarness } from '../support/server-harness.js';

describe('finished trajectories the journal cannot record (a failing disk)', () => {
  it('are logged as one line with the cause, the rest counted, at most a line a minute (was a line with a stack per trajectory), and still delivered', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-s39-unrecorded-'));
    const lines: Record<string, unknown>[] = [];
    const destination = new Writable({
      write(chunk: Buffer, _encoding, done) {
        for (const line of chunk.toString().split('\n')) if (line !== '') lines.push(JSON.parse(line) as Record<string, unknown>);
        done();
      },
    });
    const h = await startServerHarness({ config: { journal: { dir } }, logger: createLogger({ level: 'info', destination }) });
    const samples = 6;
    try {
      const journal = h.server.journal!;
      // A DOUBLE of the journal's trajectory write on a disk that returns EIO: what Journal.finished throws then (a
      // one-line message naming the errno and the file, the lmdb error with its stack as the cause). Accepts are real.
      const cause = new Error('Input/output error');
      journal.finished = (taskId: string, sampleIndex: number): Promise<void> =>
        Promise.reject(new RolloutError('unavailable', `the journal could not record trajectory ${sampleIndex} of task "${taskId}": EIO (input/output error) at ${join(dir, 'data.mdb')}`, { cause }));
      await h.client.submit(mathTask('eio', samples, 1));
      for (let i = 0; i < samples; i++) {
        // Delivered anyway: GetTrajectory finds each once its failed write was handled.
        expect((await h.client.getTrajectory('eio', { sampleIndex: i, wait: true })).trajectories.map((t) => t.sampleIndex)).toEqual([i]);
      }
    } finally {
      await h.close();
      rmSync(dir, { recursive: true, force: true });
    }
    const unrecorded = lines.filter((l) => typeof l.msg === 'string' && l.msg.startsWith('journal could not record'));
    // Before the fix: one error line per trajectory, each with the error serialized whole (stack included).
    // Before the fix: one error line per trajectory, each with the error serialized whole (stack included). Now one,
    // with the cause in a line; the others are counted (`suppressed`, on the next line, at most one a minute).
    expect(unrecorded).toEqual([
      expect.objectContaining({
        level: 50,
        msg: 'journal could not record a finished trajectory; delivered anyway',
        taskId: 'eio',
        reason: expect.stringMatching(/^the journal could not record trajectory \d of task "eio": EIO \(input\/output error\) at .*data\.mdb$/),
      }),
    ]);
    expect(JSON.stringify(unrecorded)).not.toContain('"stack"');
    expect(unrecorded[0]).not.toHaveProperty('err');
  }, 120_000);
});
