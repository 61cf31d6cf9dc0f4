import { startHarness, mathTask } from './harness.js';
const h = await startHarness();
const s1 = h.client.openSession({ sessionId: 'resume-me' });
await s1.submit(mathTask('resume-a', 2, 31));
await s1.submit(mathTask('resume-b', 2, 32));
console.log('submitted');
const got: string[] = [];
for await (const t of s1.trajectories()) {
  got.push(`${t.taskId}#${t.sampleIndex}`);
  console.log('got', got.at(-1));
  if (got.length === 1) s1.ack([{ taskId: t.taskId, sampleIndex: t.sampleIndex }]);
  if (got.length === 2) break;
}
console.log('broke');
await new Promise((r) => setTimeout(r, 200));
s1.abort();
await new Promise((r) => setTimeout(r, 200));
const s2 = h.client.openSession({ sessionId: 'resume-me', resume: true });
console.log('opened?');
const opened = await s2.opened.catch((e) => e);
console.log('opened', opened);
s2.close();
for await (const t of s2.trajectories()) console.log('rest', t.taskId, t.sampleIndex);
await h.close();
