// Started by review-s39-rootless-server.test.ts under `setpriv --reuid=UID` as a user that is NOT root: starts the real
// `rollout serve` (bin/rollout.js, the CLI a deployment runs) with the fake vLLM engine (a test double, --fake-engine),
// default bubblewrap sandboxes and a journal in DIR, submits math tasks through the TypeScript client (the engine's
// scripted agent calls the python tool in the sandbox, then answers), stops the server with SIGTERM and prints what
// came back as one JSON object on stdout.
// argv: DIR IMAGE CHECKER — IMAGE a .sif (or `-` for the host's /usr), CHECKER the math checker (builtin, math-verify).
import { spawn } from 'node:child_process';
import { readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { makeMathProblem } from '../../src/testing/arithmetic.js';
import { Role, TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';

const [dir = '', image = '-', checker = 'builtin'] = process.argv.slice(2);
const root = fileURLToPath(new URL('../..', import.meta.url));
const journal = join(dir, 'journal');
const config = join(dir, 'config.json');
writeFileSync(config, JSON.stringify({ sandbox: image === '-' ? {} : { image } }));

const serve = spawn(process.execPath, [
  'bin/rollout.js', 'serve', '--port', '0', '--fake-engine', '--fake-latency-ms', '0', '--journal-dir', journal,
  '--math-checker', checker, '--config', config,
], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'info' } });
let stdout = '';
let stderr = '';
serve.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
const exited = new Promise<number | null>((resolve) => serve.once('close', resolve));
const address = await new Promise<string>((resolve, reject) => {
  serve.stdout.on('data', (c: Buffer) => {
    stdout += c.toString();
    const m = /listening on (\S+)/.exec(stdout);
    if (m) resolve(m[1]!);
  });
  void exited.then((code) => reject(new Error(`serve exited ${code} before listening: ${stderr.slice(-2000)}`)));
});

const client = new RolloutClient(address);
const session = client.openSession({ sessionId: 'rootless' });
const tasks = [0, 1].map((i) => {
  const p = makeMathProblem(4242 + i);
  return {
    taskId: `rootless-${i}`, environment: 'math', numSamples: 2,
    instance: { problem: p.question, answer: String(p.answer) },
    sampling: { temperature: 1, seed: 4242 + i, maxTokensPerTurn: 256, maxTotalTokens: 4096, stop: [] },
  };
});
await Promise.all(tasks.map((t) => session.submit(t)));
session.close();
const got: Trajectory[] = [];
for await (const t of session.trajectories()) got.push(t);
client.close();
// SIGTERM drains and stops the server, and the process ends. Before, with --math-checker its checker thread kept it
// alive after "rollout server stopped" until a second signal: one is sent here only 60 s after the stop (a process
// that ends ends within milliseconds of it), and `signals` says how many it took.
const stopped = new Promise<boolean>((resolve) => {
  const check = (): void => {
    if (stdout.includes('"msg":"rollout server stopped"')) resolve(true);
  };
  serve.stdout.on('data', check);
  void exited.then(() => resolve(stdout.includes('"msg":"rollout server stopped"')));
});
let signals = 1;
serve.kill('SIGTERM');
const drained = await stopped;
const second = setTimeout(() => {
  signals = 2;
  serve.kill('SIGTERM');
}, 60_000);
const exitCode = await exited;
clearTimeout(second);

const owners = (() => {
  try {
    return Object.fromEntries(readdirSync(journal).map((f) => [f, statSync(join(journal, f)).uid]));
  } catch (err) {
    return { error: String(err) };
  }
})();
const report = {
  uid: process.getuid?.(),
  trajectories: got
    .sort((a, b) => `${a.taskId}#${a.sampleIndex}`.localeCompare(`${b.taskId}#${b.sampleIndex}`))
    .map((t) => ({
      taskId: t.taskId, sampleIndex: t.sampleIndex, status: TrajectoryStatus[t.status], finishReason: t.finishReason,
      error: t.error, reward: t.reward, roles: t.turns.map((turn) => Role[turn.role]),
    })),
  journalOwners: owners,
  drained,
  signals,
  exitCode,
  serveLog: stderr.slice(-4000),
};
process.stdout.write(`${JSON.stringify(report)}\n`);
