/**
 * A minimal TypeScript trainer loop: one Rollout stream, GRPO groups of math tasks, group-relative advantages
 * computed as trajectories arrive. Run against any server:
 *
 *   node bin/rollout.js serve --port 50051 --fake-engine &      # or with --backend http://<vllm>:8000
 *   npx tsx examples/ts/quickstart.ts 127.0.0.1:50051
 */
import { RolloutClient } from '../../src/client/rollout-client.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';

const address = process.argv[2] ?? '127.0.0.1:50051';
const client = new RolloutClient(address);
const session = client.openSession({ sessionId: `quickstart-${process.pid}` });

const problems = [
  { problem: 'What is 17 * 23 + 5?', answer: '396' },
  { problem: 'What is 12 * (12 - 3)?', answer: '108' },
];
for (const [i, instance] of problems.entries()) {
  await session.submit({
    taskId: `quickstart-${process.pid}-${i}`,
    groupId: `q${i}`,
    environment: 'math',
    numSamples: 4,
    instance,
    sampling: { temperature: 1, maxTokensPerTurn: 512, maxTotalTokens: 4096, stop: [] },
  });
}
session.close();

const groups = new Map<string, Trajectory[]>();
for await (const t of session.trajectories()) {
  // Infrastructure failures carry their own status: leave them out of the batch instead of training on reward 0.
  if (t.status !== TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED && t.status !== TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED) {
    console.log(`skip ${t.taskId}#${t.sampleIndex}: ${TrajectoryStatus[t.status]} ${t.error}`);
    continue;
  }
  const group = [...(groups.get(t.groupId) ?? []), t];
  groups.set(t.groupId, group);
  if (group.length === 4) {
    const mean = group.reduce((sum, x) => sum + x.reward, 0) / group.length;
    const advantages = group.map((x) => (x.reward - mean).toFixed(2));
    const trained = group.reduce((sum, x) => sum + x.responseMask.reduce((a, m) => a + m, 0), 0);
    console.log(`group ${t.groupId}: rewards ${group.map((x) => x.reward)} advantages ${advantages} (${trained} policy tokens)`);
  }
}
client.close();
