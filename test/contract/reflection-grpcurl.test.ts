import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeMathProblem } from '../../src/testing/arithmetic.js';
import { startHarness, type Harness } from '../support/harness.js';
import { grpcurl, invoke, invokeRaw, requireGrpcurl } from '../support/grpcurl.js';

const ADMIN = 'authorization: Bearer grpcurl-admin';
const SERVICES = ['rollout.v1.RolloutService', 'rollout.v1.BackendService', 'grpc.health.v1.Health'];

interface JsonTrajectory {
  task_id: string;
  sample_index: number;
  environment: string;
  status: string;
  prompt_token_ids: number[];
  response_token_ids: number[];
  response_mask: number[];
  response_logprobs: number[];
  reward: number;
  metadata: Record<string, string>;
}

/** The unary RPCs a service declares, read from grpcurl's `describe` (no `stream` on either side). */
function unaryMethods(description: string): string[] {
  return [...description.matchAll(/^\s*rpc (\w+) \( (?!stream)[.\w]+ \) returns \( (?!stream)[.\w]+ \);$/gm)].map((m) => m[1]!).sort();
}

function mathSpec(taskId: string, numSamples: number, seed: number, maxTurns = 0): object {
  const problem = makeMathProblem(seed);
  return {
    task_id: taskId,
    environment: 'math',
    num_samples: numSamples,
    instance: { problem: problem.question, answer: String(problem.answer) },
    sampling: { temperature: 1, seed, max_tokens_per_turn: 256, max_total_tokens: 4096 },
    limits: { max_turns: maxTurns },
    metadata: { via: 'grpcurl' },
  };
}

describe('grpcurl, by server reflection alone', () => {
  let h: Harness;
  let address: string;
  beforeAll(async () => {
    requireGrpcurl();
    h = await startHarness({ adminToken: 'grpcurl-admin' });
    address = h.server.address;
  });
  afterAll(async () => h?.close());

  it('lists every served service, reflection and health included', async () => {
    const { code, stdout, stderr } = await grpcurl(address, [], ['list']);
    expect(code, stderr).toBe(0);
    const listed = stdout.trim().split('\n');
    expect(listed).toEqual(expect.arrayContaining([...SERVICES, 'grpc.reflection.v1.ServerReflection', 'grpc.reflection.v1alpha.ServerReflection']));
  });

  it('describes every listed service and the messages that reference google.protobuf.Struct', async () => {
    const listed = (await grpcurl(address, [], ['list'])).stdout.trim().split('\n');
    for (const service of listed) {
      const { code, stdout, stderr } = await grpcurl(address, [], ['describe', service]);
      expect(code, `${service}: ${stderr}`).toBe(0);
      expect(stdout).toContain(`${service} is a service:`);
    }
    const taskSpec = await grpcurl(address, [], ['describe', 'rollout.v1.TaskSpec']);
    expect(taskSpec.code, taskSpec.stderr).toBe(0);
    expect(taskSpec.stdout).toContain('.google.protobuf.Struct instance = 5;');
    expect(taskSpec.stdout).toContain('map<string, string> metadata = 8;');
    const trajectory = await grpcurl(address, [], ['describe', 'rollout.v1.Trajectory']);
    expect(trajectory.code, trajectory.stderr).toBe(0);
    expect(trajectory.stdout).toContain('.google.protobuf.Struct eval_report = 15;');
    expect(trajectory.stdout).toContain('map<string, double> reward_details = 14;');
    const sampling = await grpcurl(address, [], ['describe', 'rollout.v1.SamplingParams']);
    expect(sampling.stdout).toContain('optional float temperature = 1;');
    const struct = await grpcurl(address, [], ['describe', 'google.protobuf.Struct']);
    expect(struct.stdout).toContain('map<string, .google.protobuf.Value> fields = 1;');
  });

  it('invokes every unary RPC of RolloutService: ListEnvironments, Submit, GetTrajectory (wait), Cancel', async () => {
    const described = await grpcurl(address, [], ['describe', 'rollout.v1.RolloutService']);
    expect(unaryMethods(described.stdout)).toEqual(['Cancel', 'GetTrajectory', 'ListEnvironments', 'Submit']);

    const envs = await invoke<{ environments: { name: string; tools: string[]; instance_schema: { required: string[] } }[] }>(
      address,
      'rollout.v1.RolloutService/ListEnvironments',
      {},
    );
    const math = envs.environments.find((e) => e.name === 'math');
    expect(math?.tools).toEqual(['python', 'bash', 'finish']);
    expect(math?.instance_schema.required).toEqual(expect.arrayContaining(['problem', 'answer']));

    const submitted = await invoke<{ task_id: string; num_samples: number; duplicate: boolean }>(address, 'rollout.v1.RolloutService/Submit', {
      task: mathSpec('grpcurl-math', 2, 17),
    });
    expect(submitted).toEqual({ task_id: 'grpcurl-math', num_samples: 2, duplicate: false });
    const got = await invoke<{ trajectories: JsonTrajectory[]; pending: number }>(address, 'rollout.v1.RolloutService/GetTrajectory', {
      task_id: 'grpcurl-math',
      wait: true,
    });
    expect(got.pending).toBe(0);
    expect(got.trajectories.map((t) => t.sample_index)).toEqual([0, 1]);
    for (const t of got.trajectories) {
      expect(['TRAJECTORY_STATUS_COMPLETED', 'TRAJECTORY_STATUS_TRUNCATED']).toContain(t.status);
      expect(t.environment).toBe('math');
      expect(t.metadata).toEqual({ via: 'grpcurl' });
      expect(t.prompt_token_ids.length).toBeGreaterThan(0);
      expect(t.response_token_ids.length).toBeGreaterThan(0);
      expect(t.response_mask).toHaveLength(t.response_token_ids.length);
      expect(t.response_logprobs).toHaveLength(t.response_token_ids.length);
      expect([0, 1]).toContain(t.reward);
    }
    const one = await invoke<{ trajectories: JsonTrajectory[] }>(address, 'rollout.v1.RolloutService/GetTrajectory', { task_id: 'grpcurl-math', sample_index: 1 });
    expect(one.trajectories.map((t) => t.sample_index)).toEqual([1]);

    h.engine.failNext(2, { kind: 'hang' }); // both samples of the next task hang in the engine until cancelled
    await invoke(address, 'rollout.v1.RolloutService/Submit', { task: mathSpec('grpcurl-cancel', 2, 18, 8) });
    await new Promise((r) => setTimeout(r, 500));
    expect(await invoke(address, 'rollout.v1.RolloutService/Cancel', { task_id: 'grpcurl-cancel' })).toEqual({ cancelled: 2 });
    const cancelled = await invoke<{ trajectories: JsonTrajectory[] }>(address, 'rollout.v1.RolloutService/GetTrajectory', { task_id: 'grpcurl-cancel', wait: true });
    expect(cancelled.trajectories.map((t) => t.status)).toEqual(['TRAJECTORY_STATUS_CANCELLED', 'TRAJECTORY_STATUS_CANCELLED']);

    const missing = await invokeRaw(address, 'rollout.v1.RolloutService/Cancel', { task_id: 'no-such-task' });
    expect(missing.code).not.toBe(0);
    expect(missing.stderr).toContain('Code: NotFound');
  });

  it('invokes every unary RPC of BackendService with the admin token in a header, and is refused without it', async () => {
    const described = await grpcurl(address, [], ['describe', 'rollout.v1.BackendService']);
    expect(unaryMethods(described.stdout)).toEqual(['AddBackend', 'ListBackends', 'PauseGeneration', 'RemoveBackend', 'ResumeGeneration']);

    const denied = await invokeRaw(address, 'rollout.v1.BackendService/ListBackends', {});
    expect(denied.code).not.toBe(0);
    expect(denied.stderr).toContain('Code: Unauthenticated');

    type Backends = { backends: { id: string; url: string; kind: string; max_concurrency: number; healthy: boolean }[] };
    const before = await invoke<Backends>(address, 'rollout.v1.BackendService/ListBackends', {}, [ADMIN]);
    expect(before.backends).toHaveLength(1);
    expect(before.backends[0]).toMatchObject({ url: h.engine.url, kind: 'BACKEND_KIND_VLLM', healthy: true });
    const added = await invoke<{ backend: { id: string; max_concurrency: number; kind: string } }>(
      address,
      'rollout.v1.BackendService/AddBackend',
      { url: 'http://127.0.0.1:9/', id: 'grpcurl-spare', max_concurrency: 4, kind: 'BACKEND_KIND_VLLM' },
      [ADMIN],
    );
    expect(added.backend).toMatchObject({ id: 'grpcurl-spare', max_concurrency: 4, kind: 'BACKEND_KIND_VLLM' });
    const during = await invoke<Backends>(address, 'rollout.v1.BackendService/ListBackends', {}, [ADMIN]);
    expect(during.backends.map((b) => b.id).sort()).toEqual([before.backends[0]!.id, 'grpcurl-spare'].sort());
    expect(await invoke(address, 'rollout.v1.BackendService/RemoveBackend', { id: 'grpcurl-spare' }, [ADMIN])).toEqual({});
    const after = await invoke<Backends>(address, 'rollout.v1.BackendService/ListBackends', {}, [ADMIN]);
    expect(after.backends.map((b) => b.id)).toEqual([before.backends[0]!.id]);

    type Versioned = { backends: { id: string; paused?: boolean; policy_version?: string }[] };
    const paused = await invoke<Versioned>(address, 'rollout.v1.BackendService/PauseGeneration', { mode: 'PAUSE_MODE_WAIT' }, [ADMIN]);
    expect(paused.backends).toEqual([expect.objectContaining({ id: before.backends[0]!.id, paused: true })]);
    const resumed = await invoke<Versioned>(address, 'rollout.v1.BackendService/ResumeGeneration', { policy_version: 3 }, [ADMIN]);
    expect(resumed.backends).toEqual([expect.objectContaining({ id: before.backends[0]!.id, policy_version: '3' })]);
    expect(resumed.backends[0]!.paused ?? false).toBe(false);
  });

  it('answers grpc.health.v1.Health/Check for the server and each service', async () => {
    expect(await invoke(address, 'grpc.health.v1.Health/Check', {})).toEqual({ status: 'SERVING' });
    for (const service of SERVICES.slice(0, 2)) {
      expect(await invoke(address, 'grpc.health.v1.Health/Check', { service })).toEqual({ status: 'SERVING' });
    }
    const unknown = await invokeRaw(address, 'grpc.health.v1.Health/Check', { service: 'no.such.Service' });
    expect(unknown.stderr).toContain('Code: NotFound');
  });
});
