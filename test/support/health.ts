import { credentials as grpcCredentials, loadPackageDefinition, type ChannelCredentials } from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import { protoPath as healthProtoPath } from 'grpc-health-check';

interface HealthStub {
  check(request: { service: string }, callback: (err: Error | null, value?: { status: string }) => void): void;
  close(): void;
}

const healthPkg = loadPackageDefinition(loadSync(healthProtoPath, { enums: String })) as unknown as {
  grpc: { health: { v1: { Health: new (address: string, credentials: ChannelCredentials) => HealthStub } } };
};

/** Every service the server reports on: the overall status ("") and each named one. */
export const HEALTH_SERVICES = ['', 'rollout.v1.RolloutService', 'rollout.v1.BackendService', 'rollout.v1.AdminService'];

/** grpc.health.v1 Check of each service, as a load balancer would ask (no token). */
export async function healthStatuses(address: string, credentials: ChannelCredentials = grpcCredentials.createInsecure(), services = HEALTH_SERVICES): Promise<Record<string, string>> {
  const stub = new healthPkg.grpc.health.v1.Health(address, credentials);
  try {
    const answers = await Promise.all(
      services.map((service) => new Promise<string>((resolve, reject) => stub.check({ service }, (err, value) => (err ? reject(err) : resolve(value!.status))))),
    );
    return Object.fromEntries(services.map((service, i) => [service, answers[i]!]));
  } finally {
    stub.close();
  }
}
