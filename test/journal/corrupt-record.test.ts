import { open } from 'lmdb';
import { describe, expect, it } from 'vitest';
import { mathTask } from '../support/harness.js';
import { journalSuite } from '../support/journal-suite.js';
import type { ServerHarness } from '../support/server-harness.js';

const suite = journalSuite();

const journaled = (dir: string): Promise<ServerHarness> => suite.server(dir);

/** A journal with two good tasks (one finished), then one record damaged by `damage`. */
async function journalWith(damage: (db: ReturnType<typeof open>) => void): Promise<string> {
  const dir = await suite.dir('journal-corrupt-');
  const a = await journaled(dir);
  await a.client.submit(mathTask('good', 1, 11));
  await a.client.submit(mathTask('victim', 1, 12));
  await a.client.getTrajectory('good', { wait: true, deadlineMs: 60_000 });
  await a.client.getTrajectory('victim', { wait: true, deadlineMs: 60_000 });
  await a.close(); // idempotent: the suite's close after the test does nothing more
  const db = open({ path: dir, compression: false });
  damage(db);
  await db.close();
  return dir;
}

describe('a journal holding one damaged record (partial write, other version, hand edit)', () => {
  it('a truncated trajectory record does not stop the server from starting: the record is reported/skipped, the rest recovered', async () => {
    const dir = await journalWith((db) => {
      const bytes = db.get(['r', 'victim', 0]) as Uint8Array;
      db.putSync(['r', 'victim', 0], bytes.subarray(0, Math.floor(bytes.length / 2)));
    });
    const b = await journaled(dir); // before the fix: rejected with a RangeError from Trajectory.decode
    expect((await b.client.submit(mathTask('good', 1, 11))).duplicate).toBe(true);
  }, 120_000);

  it('a task record whose spec bytes do not decode does not stop the server from starting', async () => {
    const dir = await journalWith((db) => {
      const record = db.get(['t', 'victim']) as { spec: Uint8Array };
      db.putSync(['t', 'victim'], { ...record, spec: new Uint8Array([0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]) });
    });
    const b = await journaled(dir);
    expect((await b.client.submit(mathTask('good', 1, 11))).duplicate).toBe(true);
  }, 120_000);

  it('a task record from another version (not the shape this one writes) does not stop the server from starting', async () => {
    const dir = await journalWith((db) => {
      db.putSync(['t', 'victim'], { v: 2, payload: 'something newer' });
    });
    const b = await journaled(dir);
    expect((await b.client.submit(mathTask('good', 1, 11))).duplicate).toBe(true);
  }, 120_000);
});
