import { credentials, Metadata, Server, ServerCredentials, status, type ChannelCredentials, type ServiceError } from '@grpc/grpc-js';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { authInterceptor, bearerMatches } from '../../src/contract/auth.js';
import { RolloutServiceClient, RolloutServiceService, TaskSpec } from '../../gen/ts/rollout/v1/rollout.js';
import { BackendServiceClient } from '../../gen/ts/rollout/v1/backend.js';
import { AdminServiceClient, ServerState } from '../../gen/ts/rollout/v1/admin.js';
import { collect, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { grpcurl, requireGrpcurl } from '../support/grpcurl.js';
import { healthStatuses } from '../support/health.js';
import { makeTestCerts, type TestCerts } from '../support/test-certs.js';

const TOKEN = 'trainer-secret-7f3a';
const ADMIN_TOKEN = 'admin-secret-91c2';

type Callback<T> = (err: ServiceError | null, value?: T) => void;

/** The status code a unary call ends with (OK = 0). */
function codeOf<T>(invoke: (metadata: Metadata, cb: Callback<T>) => unknown): Promise<number> {
  return new Promise((resolve) => {
    invoke(new Metadata(), (err) => resolve(err ? err.code : status.OK));
  });
}

function bearer(token: string | undefined): Metadata {
  const metadata = new Metadata();
  if (token !== undefined) metadata.set('authorization', `Bearer ${token}`);
  return metadata;
}

/** The status a server stream or bidi stream ends with; with `admittedOnData`, -1 as soon as a message arrives. */
function streamCode(stream: NodeJS.EventEmitter & { cancel(): void }, admittedOnData = false): Promise<{ code: number; details: string }> {
  return new Promise((resolve) => {
    stream.on('data', () => {
      if (admittedOnData) resolve({ code: -1, details: 'streaming' });
    });
    stream.on('error', (err: ServiceError) => resolve({ code: err.code, details: err.details }));
    stream.on('status', (s: { code: number; details: string }) => {
      if (s.code === status.OK) resolve(s);
    });
  });
}

/** Every RolloutService RPC once, with `token` (or none): the status codes by RPC. */
async function rolloutServiceCodes(address: string, token: string | undefined, channel: ChannelCredentials = credentials.createInsecure()): Promise<Record<string, number>> {
  const stub = new RolloutServiceClient(address, channel);
  const md = (): Metadata => bearer(token);
  try {
    const rollout = stub.rollout(md());
    const rolloutDone = streamCode(rollout);
    rollout.write({ kind: { $case: 'open', value: { sessionId: '', resume: false, stageEvents: false } } });
    rollout.end();
    // A watch that was let in never ends by itself: its first stats message (every 100 ms) says it streams.
    const watch = stub.watch({ environments: [], groupIds: [], stageEvents: true, fullTrajectories: false, statsIntervalMs: 100 }, md());
    const watchDone = streamCode(watch, true);
    const [submit, getTrajectory, cancel, listEnvironments, rolloutStatus, watchStatus] = await Promise.all([
      codeOf((_, cb) => stub.submit({ task: TaskSpec.fromPartial(mathTask('auth-probe', 1, 1)) }, md(), cb)),
      codeOf((_, cb) => stub.getTrajectory({ taskId: 'nope', wait: false }, md(), cb)),
      codeOf((_, cb) => stub.cancel({ taskId: 'nope' }, md(), cb)),
      codeOf((_, cb) => stub.listEnvironments({}, md(), cb)),
      rolloutDone,
      watchDone,
    ]);
    watch.cancel();
    return { submit, getTrajectory, cancel, listEnvironments, rollout: rolloutStatus.code, watch: watchStatus.code };
  } finally {
    stub.close();
  }
}

describe('bearer tokens: RolloutService takes the token, BackendService and AdminService the admin token', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({ config: { auth: { token: TOKEN, adminToken: ADMIN_TOKEN } } });
  }, 60_000);
  afterAll(() => h?.close());

  it('refuses every RolloutService RPC — Rollout and Watch streams included — without the token or with a wrong one', async () => {
    const all = (code: number) => ({ submit: code, getTrajectory: code, cancel: code, listEnvironments: code, rollout: code, watch: code });
    expect(await rolloutServiceCodes(h.server.address, undefined)).toEqual(all(status.UNAUTHENTICATED));
    expect(await rolloutServiceCodes(h.server.address, 'wrong')).toEqual(all(status.UNAUTHENTICATED));
    // The admin token is not the trainer's token.
    expect(await rolloutServiceCodes(h.server.address, ADMIN_TOKEN)).toEqual(all(status.UNAUTHENTICATED));
    // Same length as the real one, one byte off.
    expect(await rolloutServiceCodes(h.server.address, `${TOKEN.slice(0, -1)}b`)).toEqual(all(status.UNAUTHENTICATED));
  }, 60_000);

  it('lets the right token through on every RPC; the TypeScript client carries it on streams', async () => {
    const codes = await rolloutServiceCodes(h.server.address, TOKEN);
    expect(codes).toEqual({ submit: status.OK, getTrajectory: status.NOT_FOUND, cancel: status.NOT_FOUND, listEnvironments: status.OK, rollout: status.OK, watch: -1 });
    const client = new RolloutClient(h.server.address, { token: TOKEN });
    try {
      const session = client.openSession();
      await session.submit(mathTask('auth-ok', 2, 3));
      session.close();
      const got = await collect(session.trajectories());
      expect(got.map((t) => t.sampleIndex).sort()).toEqual([0, 1]);
    } finally {
      client.close();
    }
  }, 60_000);

  it('guards BackendService and AdminService with the admin token only', async () => {
    const backends = new BackendServiceClient(h.server.address, credentials.createInsecure());
    const admin = new AdminServiceClient(h.server.address, credentials.createInsecure());
    try {
      for (const token of [undefined, 'wrong', TOKEN]) {
        expect(await codeOf((_, cb) => backends.listBackends({}, bearer(token), cb))).toBe(status.UNAUTHENTICATED);
        expect(await codeOf((_, cb) => admin.getServerState({}, bearer(token), cb))).toBe(status.UNAUTHENTICATED);
        expect(await codeOf((_, cb) => admin.drain({}, bearer(token), cb))).toBe(status.UNAUTHENTICATED);
      }
      expect(await codeOf((_, cb) => backends.listBackends({}, bearer(ADMIN_TOKEN), cb))).toBe(status.OK);
      const state = await new Promise<ServerState | undefined>((resolve, reject) => admin.getServerState({}, bearer(ADMIN_TOKEN), (err, v) => (err ? reject(err) : resolve(v?.state))));
      expect(state).toBe(ServerState.SERVER_STATE_RUNNING);
    } finally {
      backends.close();
      admin.close();
    }
  });

  it('keeps health checking and reflection open (load balancers and grpcurl carry no token)', async () => {
    expect(Object.values(await healthStatuses(h.server.address))).toEqual(['SERVING', 'SERVING', 'SERVING', 'SERVING']);
    requireGrpcurl();
    const listed = await grpcurl(h.server.address, [], ['list']);
    expect(listed.code).toBe(0);
    expect(listed.stdout).toContain('rollout.v1.AdminService');
    expect(listed.stdout).toContain('rollout.v1.RolloutService');
  }, 60_000);
});

describe('TLS and mTLS with certificates made at test time', () => {
  let certs: TestCerts;
  beforeAll(async () => {
    certs = await makeTestCerts();
  }, 60_000);
  afterAll(() => certs?.remove());

  it('a TLS server refuses plaintext and serves a TLS client that trusts its CA and sends the token', async () => {
    const h = await startServerHarness({ config: { auth: { token: TOKEN }, tls: { certFile: certs.serverCertFile, keyFile: certs.serverKeyFile } } });
    try {
      const plain = await rolloutServiceCodes(h.server.address, TOKEN);
      expect(plain.listEnvironments).toBe(status.UNAVAILABLE);
      expect(plain.rollout).toBe(status.UNAVAILABLE);
      // A TLS client that does not trust the server's CA is refused by the handshake too.
      const untrusted = await rolloutServiceCodes(h.server.address, TOKEN, credentials.createSsl());
      expect(untrusted.listEnvironments).toBe(status.UNAVAILABLE);
      // TLS without the token: still UNAUTHENTICATED (TLS is not authentication of the trainer).
      expect((await rolloutServiceCodes(h.server.address, undefined, credentials.createSsl(certs.ca))).listEnvironments).toBe(status.UNAUTHENTICATED);

      const client = new RolloutClient(h.server.address, { token: TOKEN, tls: { ca: certs.ca } });
      try {
        const session = client.openSession();
        await session.submit(mathTask('tls-ok', 2, 5));
        session.close();
        const got = await collect(session.trajectories());
        expect(got).toHaveLength(2);
        expect(got.every((t) => t.responseTokenIds.length > 0)).toBe(true);
      } finally {
        client.close();
      }
    } finally {
      await h.close();
    }
  }, 90_000);

  it('an mTLS server refuses a client without a certificate or with one from another CA, and serves one from its CA', async () => {
    const h = await startServerHarness({
      config: { auth: { token: TOKEN }, tls: { certFile: certs.serverCertFile, keyFile: certs.serverKeyFile, clientCaFile: certs.caFile, requireClientCert: true } },
    });
    try {
      const noCert = await rolloutServiceCodes(h.server.address, TOKEN, credentials.createSsl(certs.ca));
      expect(noCert.listEnvironments).toBe(status.UNAVAILABLE);
      expect(noCert.rollout).toBe(status.UNAVAILABLE);
      const stranger = await rolloutServiceCodes(h.server.address, TOKEN, credentials.createSsl(certs.ca, certs.strangerKey, certs.strangerCert));
      expect(stranger.listEnvironments).toBe(status.UNAVAILABLE);

      const client = new RolloutClient(h.server.address, { token: TOKEN, tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey } });
      try {
        const session = client.openSession();
        await session.submit(mathTask('mtls-ok', 1, 9));
        session.close();
        expect(await collect(session.trajectories())).toHaveLength(1);
      } finally {
        client.close();
      }
    } finally {
      await h.close();
    }
  }, 90_000);

  it('refuses to start with an unreadable certificate, naming the field', async () => {
    const err = (await startServerHarness({ config: { tls: { certFile: `${certs.dir}/missing.pem`, keyFile: certs.serverKeyFile } } }).catch((e: unknown) => e)) as Error & { field?: string };
    expect(err.message).toContain('tls.certFile');
    expect(err.field).toBe('tls.certFile');
  }, 60_000);
});

describe('the admin services when only the trainer token is set', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({ config: { auth: { token: TOKEN } } });
  }, 60_000);
  afterAll(() => h?.close());

  it('take the trainer token: without it, BackendService and AdminService are UNAUTHENTICATED, not open', async () => {
    const backends = new BackendServiceClient(h.server.address, credentials.createInsecure());
    const admin = new AdminServiceClient(h.server.address, credentials.createInsecure());
    try {
      for (const token of [undefined, 'wrong', ADMIN_TOKEN]) {
        expect(await codeOf((_, cb) => backends.listBackends({}, bearer(token), cb))).toBe(status.UNAUTHENTICATED);
        expect(await codeOf((_, cb) => admin.getServerState({}, bearer(token), cb))).toBe(status.UNAUTHENTICATED);
        expect(await codeOf((_, cb) => admin.drain({}, bearer(token), cb))).toBe(status.UNAUTHENTICATED);
      }
      expect(await codeOf((_, cb) => backends.listBackends({}, bearer(TOKEN), cb))).toBe(status.OK);
      expect(await codeOf((_, cb) => admin.getServerState({}, bearer(TOKEN), cb))).toBe(status.OK);
      // The refusal names the token to send: the trainer's.
      const details = await new Promise<string>((resolve) => backends.listBackends({}, new Metadata(), (err) => resolve(err?.details ?? '')));
      expect(details).toBe('token required: authorization: Bearer <token>');
    } finally {
      backends.close();
      admin.close();
    }
  });

  it('are reached by the TypeScript client given only the trainer token (it sends that token there too)', async () => {
    const client = new RolloutClient(h.server.address, { token: TOKEN });
    try {
      expect((await client.listBackends()).length).toBe(1);
    } finally {
      client.close();
    }
  });

  it('a token no HTTP/2 header can carry is refused by the TypeScript client at once, without quoting it', () => {
    for (const token of ['secret\nsecond-half', 'sécret', 'with space']) {
      expect(() => new RolloutClient(h.server.address, { token })).toThrow(/^token: must be printable ASCII/);
      expect(() => new RolloutClient(h.server.address, { adminToken: token })).toThrow(/^adminToken: must be printable ASCII/);
    }
  });
});

describe('refused calls are logged at a bounded rate', () => {
  it('lets a burst of lines through, then counts the rest and reports the count on the next line', async () => {
    const lines: Array<Record<string, unknown>> = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, cb) {
        for (const line of chunk.toString().split('\n').filter(Boolean)) lines.push(JSON.parse(line) as Record<string, unknown>);
        cb();
      },
    });
    let now = 0;
    const server = new Server({ interceptors: [authInterceptor({ token: TOKEN }, pino({ level: 'info' }, sink), { burst: 5, linesPerSecond: 1, now: () => now })] });
    server.addService(RolloutServiceService, { listEnvironments: (_call: unknown, cb: (e: null, r: object) => void) => cb(null, { environments: [] }) } as never);
    const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
    const stub = new RolloutServiceClient(`127.0.0.1:${port}`, credentials.createInsecure());
    try {
      const refused = async (n: number): Promise<void> => {
        for (let i = 0; i < n; i++) expect(await codeOf((_, cb) => stub.listEnvironments({}, bearer('wrong'), cb))).toBe(status.UNAUTHENTICATED);
      };
      await refused(50);
      await new Promise((r) => setImmediate(r));
      expect(lines.filter((l) => l.msg === 'call refused: missing or wrong bearer token')).toHaveLength(5);
      now += 1_000; // one line's worth of rate
      await refused(1);
      await new Promise((r) => setImmediate(r));
      const refusals = lines.filter((l) => l.msg === 'call refused: missing or wrong bearer token');
      expect(refusals).toHaveLength(6);
      expect(refusals[5]).toMatchObject({ level: 40, component: 'auth', method: '/rollout.v1.RolloutService/ListEnvironments', given: true, suppressed: 45 });
    } finally {
      stub.close();
      server.forceShutdown();
    }
  });
});

describe('a server with no token at all', () => {
  it('stays open (local use) but warns, whatever the host', async () => {
    let logs = '';
    const sink = new Writable({
      write(chunk: Buffer, _enc, cb) {
        logs += chunk.toString();
        cb();
      },
    });
    const h = await startServerHarness({ config: { host: '127.0.0.1' }, logger: pino({ level: 'warn' }, sink) });
    try {
      expect(logs).toContain('no tokens: anyone who reaches this address may submit tasks, add or remove engines and drain the server');
      expect(await h.client.listBackends()).toHaveLength(1);
    } finally {
      await h.close();
    }
  });
});

describe('bearerMatches (the check BackendService does when it is mounted without the interceptor)', () => {
  it('takes exactly "Bearer <token>" and nothing else: not a prefix, a longer one, another scheme, a non-string', () => {
    expect(bearerMatches('Bearer s3cret', 's3cret')).toBe(true);
    for (const given of ['Bearer s3cre', 'Bearer s3crett', 'bearer s3cret', 's3cret', '', 'Bearer s3cretBearer s3cret', undefined, Buffer.from('Bearer s3cret')]) {
      expect(bearerMatches(given, 's3cret')).toBe(false);
    }
  });
});
