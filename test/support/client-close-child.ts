/**
 * Child process of test/client/review-s42-client-close.test.ts: a RolloutClient against the address in argv[2] (a
 * server double that never answers) starts a getTrajectory with wait, a submit and a watch, closes the client once
 * the server has them all (SIGUSR2), and prints one JSON line per outcome; then lets the process end on
 * its own (no process.exit): how long that takes is what the test measures.
 */
import { RolloutClient } from '../../src/client/rollout-client.js';

const client = new RolloutClient(process.argv[2]!);
const say = (o: object): void => void process.stdout.write(`${JSON.stringify(o)}\n`);
const outcome = (name: string, p: Promise<unknown>): void =>
  void p.then(
    () => say({ name, settled: 'resolved' }),
    (e: Error & { code?: number }) => say({ name, settled: 'rejected', code: e.code, message: e.message }),
  );
outcome('getTrajectory', client.getTrajectory('t', { wait: true }));
outcome('submit', client.submit({ taskId: 's', environment: 'math', instance: {} as never }));
const watch = client.watch({});
outcome(
  'watch',
  (async () => {
    let n = 0;
    for await (const _ of watch) n++;
    return n;
  })(),
);
process.once('SIGUSR2', () => {
  client.close();
  say({ name: 'closed' });
  outcome('after', client.listEnvironments());
});
say({ name: 'started' });
