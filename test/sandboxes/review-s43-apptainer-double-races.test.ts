import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { parseInstanceList } from '../../src/sandboxes/apptainer-instances.js';
import { makeApptainerDouble, type ApptainerDouble } from './apptainer-double.js';

/**
 * The apptainer TEST DOUBLE under concurrency. Tests poll `instance list --json` while the driver (or its watchdog)
 * stops instances; the double read an instance's pid a second time after checking it was alive, so a stop in between
 * printed `"pid": ,` (invalid JSON: review-s40-apptainer-watchdog failed on it in CI). A double that misbehaves
 * under a race the real CLI does not have makes the suites that use it flaky.
 */

const run = promisify(execFile);
const doubles: ApptainerDouble[] = [];
afterAll(async () => {
  await Promise.all(doubles.map((d) => d.cleanup()));
});

describe('the apptainer test double under concurrent calls', () => {
  it('instance list prints valid JSON while instances are being stopped', async () => {
    const double = makeApptainerDouble();
    doubles.push(double);
    const image = join(double.tmpRoot, 'image.sif');
    writeFileSync(image, '');
    const rounds = 4;
    const perRound = 12;
    const bad: string[] = [];
    for (let round = 0; round < rounds; round++) {
      const names = Array.from({ length: perRound }, (_, i) => `race-${round}-${i}`);
      await Promise.all(names.map((n) => run(double.binary, ['instance', 'start', image, n])));
      let stopping = true;
      const lister = async (): Promise<number> => {
        let seen = 0;
        while (stopping || seen === 0) {
          const { stdout } = await run(double.binary, ['instance', 'list', '--json']);
          seen++;
          try {
            parseInstanceList(stdout);
          } catch {
            bad.push(stdout);
          }
        }
        return seen;
      };
      const listers = [lister(), lister(), lister()];
      await Promise.all(names.map((n) => run(double.binary, ['instance', 'stop', '--force', n])));
      stopping = false;
      await Promise.all(listers);
    }
    expect(bad, bad[0]).toEqual([]);
    const { stdout } = await run(double.binary, ['instance', 'list', '--json']);
    expect(parseInstanceList(stdout)).toEqual([]);
  }, 120_000);

  it('an exec racing its instance stop never runs with the network the instance was started without', async () => {
    const double = makeApptainerDouble();
    doubles.push(double);
    const image = join(double.tmpRoot, 'image.sif');
    writeFileSync(image, '');
    const outcomes: string[] = [];
    for (let round = 0; round < 20; round++) {
      const name = `net-${round}`;
      await run(double.binary, ['instance', 'start', '--net', '--network', 'none', image, name]);
      // Inside an exec of a --net instance only the loopback interface exists; "lo" alone is the right answer.
      const exec = run(double.binary, ['exec', `instance://${name}`, 'sh', '-c', "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' \\n'"]).then(
        (r) => r.stdout.trim(),
        () => 'refused',
      );
      await run(double.binary, ['instance', 'stop', '--force', name]);
      outcomes.push(await exec);
    }
    expect(outcomes.filter((o) => o !== 'lo' && o !== 'refused')).toEqual([]);
  }, 120_000);
});
