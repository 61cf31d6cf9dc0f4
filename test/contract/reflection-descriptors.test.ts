import { loadPackageDefinition, Server, ServerCredentials, type sendUnaryData, type ServerUnaryCall, type ServiceDefinition } from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import { ReflectionService } from '@grpc/reflection';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { reflectedDefinition } from '../../src/contract/reflection.js';
import { grpcurl, invoke, requireGrpcurl } from '../support/grpcurl.js';

const FIXTURES = fileURLToPath(new URL('./fixtures/reflection/', import.meta.url));
const EDGE = 'fixture/v1/edge.proto';

/**
 * The descriptor shapes proto-loader emits wrongly for strict clients, on a fixture proto that has them all: a
 * proto3 optional before a real oneof, a snake_case map of a nested message, a well-known type, types from another
 * package (one nested in a message). grpcurl (Go's protodesc) must link, print and call it by reflection alone.
 */
describe('reflected descriptors that strict clients accept', () => {
  let server: Server;
  let address: string;
  beforeAll(async () => {
    requireGrpcurl();
    server = new Server();
    const pkg = loadPackageDefinition(loadSync(EDGE, { includeDirs: [FIXTURES] })) as unknown as {
      fixture: { v1: { EdgeService: { service: ServiceDefinition } } };
    };
    server.addService(pkg.fixture.v1.EdgeService.service, { Echo: (call: ServerUnaryCall<object, object>, cb: sendUnaryData<object>) => cb(null, call.request) });
    new ReflectionService(reflectedDefinition([EDGE], FIXTURES)).addToServer(server);
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
    );
    address = `127.0.0.1:${port}`;
  });
  afterAll(() => server?.forceShutdown());

  it('prints optional fields, the real oneof, the map and cross-package types as protoc wrote them', async () => {
    const { code, stdout, stderr } = await grpcurl(address, [], ['describe', 'fixture.v1.Edge']);
    expect(code, stderr).toBe(0);
    expect(stdout).toContain('optional string maybe = 1;');
    expect(stdout).toMatch(/oneof choice \{\s+\.fixture\.v1\.Edge\.Inner inner = 2;\s+string text = 3;\s+\}/);
    expect(stdout).toContain('optional int32 count = 4;');
    expect(stdout).toContain('map<string, .fixture.v1.Edge.Inner> snake_case_map = 5;');
    expect(stdout).toContain('.google.protobuf.Timestamp at = 6;');
    expect(stdout).toContain('.fixture.other.Shared shared = 7;');
    const inner = await grpcurl(address, [], ['describe', 'fixture.v1.Edge.Inner']);
    expect(inner.stdout).toContain('.fixture.other.Shared.Level level = 1;');
  });

  it('lists the fixture service and reflection, and echoes every shape through JSON by reflection alone', async () => {
    const listed = await grpcurl(address, [], ['list']);
    expect(listed.stdout.trim().split('\n')).toEqual(expect.arrayContaining(['fixture.v1.EdgeService', 'grpc.reflection.v1.ServerReflection']));
    const body = {
      maybe: '',
      text: 'hi',
      count: 0,
      snake_case_map: { a: { level: 'LEVEL_HIGH' } },
      at: '2026-01-02T03:04:05Z',
      shared: { level: 'LEVEL_HIGH' },
    };
    expect(await invoke(address, 'fixture.v1.EdgeService/Echo', body)).toEqual(body);
  });
});
