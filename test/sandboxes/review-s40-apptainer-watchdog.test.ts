import { spawn, spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { afterAll, describe, expect, it } from 'vitest';
import { makeApptainerDouble, type ApptainerDouble } from './apptainer-double.js';
import { eventually } from '../support/wait.js';

/**
 * Apptainer instances are not the server's children (`instance start` daemonizes them): a server killed hard left
 * them running until the next start's reap. The driver's watchdog stops them when the server dies, however it dies.
 * Run against the apptainer TEST DOUBLE (its instances are detached `sleep`s, as real ones are detached starters).
 */

const doubles: ApptainerDouble[] = [];
afterAll(async () => {
  await Promise.all(doubles.map((d) => d.cleanup()));
});

const listed = (double: ApptainerDouble): string[] =>
  (JSON.parse(spawnSync(double.binary, ['instance', 'list', '--json'], { encoding: 'utf8' }).stdout) as { instances: { instance: string }[] }).instances.map((i) => i.instance);

/** Starts review-s40-apptainer-owner.ts on a fresh double; resolves once its sandboxes are up. */
async function owner(mode: 'wait' | 'close'): Promise<{ double: ApptainerDouble; pid: number; live: string[]; stopped: string; output: () => string; exited: Promise<unknown> }> {
  const double = makeApptainerDouble();
  doubles.push(double);
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/sandboxes/review-s40-apptainer-owner.ts', double.binary, double.tmpRoot, mode], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise((resolve) => child.on('close', resolve));
  let gone = false;
  void exited.then(() => (gone = true));
  await eventually(() => gone || (mode === 'close' ? /^closed$/m : /^ready /m).test(out), 'the owner to start its sandboxes', 60_000);
  const ready = /^ready (.*)$/m.exec(out);
  if (!ready || gone) throw new Error(`the owner ended early:\n${out}`);
  const { live, stopped } = JSON.parse(ready[1]!) as { live: string[]; stopped: string };
  return { double, pid: child.pid!, live, stopped, output: () => out, exited };
}

describe('apptainer instances die with their server', () => {
  // Regression: the two live instances and their host dirs stayed after the SIGKILL (until a next server's reap).
  it('a server SIGKILLed: its live instances are stopped and its host dirs removed, within seconds', async () => {
    const o = await owner('wait');
    expect(listed(o.double).sort()).toEqual([...o.live].sort());
    expect(readdirSync(o.double.tmpRoot)).toHaveLength(2);
    process.kill(o.pid, 'SIGKILL');
    await o.exited;
    await eventually(() => listed(o.double).length === 0, 'the instances to be stopped', 20_000);
    await eventually(() => readdirSync(o.double.tmpRoot).length === 0, 'the host dirs to be removed', 20_000);
    // It stopped exactly the two live ones (the one stopped before is not stopped again), with SIGKILL.
    const stops = (await o.double.calls()).filter((c) => c.includes('stop'));
    expect(stops.slice(-2).map((c) => c.slice(0, -1))).toEqual([
      ['--silent', 'instance', 'stop', '--force'],
      ['--silent', 'instance', 'stop', '--force'],
    ]);
    expect(stops.slice(-2).map((c) => c.at(-1)).sort()).toEqual([...o.live].sort());
    expect(stops.filter((c) => c.at(-1) === o.stopped)).toHaveLength(1); // its own stop()
  }, 120_000);

  it('a clean close: the watchdog exits without a call; a server that then dies stops nothing more', async () => {
    const o = await owner('close');
    const before = (await o.double.calls()).length;
    process.kill(o.pid, 'SIGKILL');
    await o.exited;
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    expect((await o.double.calls()).length).toBe(before);
    expect(listed(o.double)).toEqual([]);
  }, 120_000);
});
