// TEST DOUBLE of a trainer in its own process, so a test can kill it -9 mid-stream. argv: server address,
// session id, number of tasks (2 samples each), how many trajectories to ack. It opens the session, submits the
// tasks, acks the first trajectories it receives, then submits a marker task and waits for its acceptance (requests
// are handled in order, so the server has then applied the acks), prints one JSON line {acked, unacked} and waits
// to be killed.
import { RolloutClient } from '../../src/client/rollout-client.js';
import { CALC_ENVIRONMENT } from '../../src/testing/calc-environment.js';
import { mathTask } from '../support/harness.js';

const [address = '', sessionId = '', tasks = '0', ackCount = '0'] = process.argv.slice(2);
const client = new RolloutClient(address);
const session = client.openSession({ sessionId, autoAck: false });
await session.opened;
for (let i = 0; i < Number(tasks); i++) await session.submit(mathTask(`${sessionId}-t${i}`, 2, 8000 + i, { environment: CALC_ENVIRONMENT }));
const acked: string[] = [];
const refs: { taskId: string; sampleIndex: number }[] = [];
const iterator = session.trajectories()[Symbol.asyncIterator]();
while (refs.length < Number(ackCount)) {
  const next = await iterator.next();
  if (next.done) throw new Error('stream ended early');
  refs.push({ taskId: next.value.taskId, sampleIndex: next.value.sampleIndex });
  acked.push(`${next.value.taskId}#${next.value.sampleIndex}`);
}
session.ack(refs);
await session.submit(mathTask(`${sessionId}-marker`, 2, 8999, { environment: CALC_ENVIRONMENT }));
process.stdout.write(`${JSON.stringify({ acked })}\n`);
setInterval(() => undefined, 60_000);
