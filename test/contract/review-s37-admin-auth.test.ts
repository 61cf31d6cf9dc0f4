import { Client, credentials, Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { connect, type ClientHttp2Session, type OutgoingHttpHeaders } from 'node:http2';
import { PassThrough } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { createLogger } from '../../src/observability/logger.js';
import { DrainRequest, DrainResponse, ServerState } from '../../gen/ts/rollout/v1/admin.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { within } from '../support/wait.js';
import { encodeFields, len, utf8, varint } from '../support/wire-bytes.js';

/**
 * Authorization headers as a client with network access but no (or a mangled) token sends them, over raw HTTP/2 so
 * nothing in a client library tidies them first; and AdminService.Drain called twice at once.
 */
const ADMIN = 'review-s37-admin-token';
const TRAINER = 'review-s37-trainer-token';

/** One raw gRPC unary call with `headers` added: its grpc-status, or the stream's error when it got none. */
function rawCall(session: ClientHttp2Session, path: string, headers: OutgoingHttpHeaders): Promise<{ status?: number; error?: string }> {
  return new Promise((resolve) => {
    const stream = session.request({ ':method': 'POST', ':path': path, 'content-type': 'application/grpc', te: 'trailers', ...headers });
    let code: number | undefined;
    const read = (h: Record<string, unknown>): void => {
      if (h['grpc-status'] !== undefined) code = Number(h['grpc-status']);
    };
    stream.on('response', read);
    stream.on('trailers', read);
    stream.on('data', () => undefined);
    stream.on('error', (err) => resolve({ error: err.message }));
    stream.on('close', () => resolve(code === undefined ? { error: `closed with code ${stream.rstCode}` } : { status: code }));
    stream.end(Buffer.alloc(5)); // one empty message
  });
}

describe('malformed authorization headers over raw HTTP/2', () => {
  let h: ServerHarness;
  let session: ClientHttp2Session;
  let logs = '';
  beforeAll(async () => {
    const sink = new PassThrough();
    sink.on('data', (chunk: Buffer) => (logs += chunk.toString()));
    h = await startServerHarness({ config: { auth: { token: TRAINER, adminToken: ADMIN } }, logger: createLogger({ level: 'debug', destination: sink }) });
    session = connect(`http://${h.server.address}`);
  }, 60_000);
  afterAll(async () => {
    session?.close();
    await h?.close();
  });

  it('are UNAUTHENTICATED on every guarded service, an over-long one is refused by the transport, and the server goes on', async () => {
    const guarded = {
      '/rollout.v1.AdminService/GetServerState': ADMIN,
      '/rollout.v1.BackendService/ListBackends': ADMIN,
      '/rollout.v1.RolloutService/ListEnvironments': TRAINER,
    };
    for (const [path, token] of Object.entries(guarded)) {
      const other = token === ADMIN ? TRAINER : ADMIN;
      const refused: Record<string, string> = {
        'lower-case scheme': `bearer ${token}`,
        'no scheme': token,
        'another scheme': `Basic ${token}`,
        'two spaces': `Bearer  ${token}`,
        'a trailing space': `Bearer ${token} `,
        '7 KB of token': `Bearer ${'x'.repeat(7_000)}`,
        "the other service's token": `Bearer ${other}`,
      };
      for (const [what, value] of Object.entries(refused)) {
        expect(await rawCall(session, path, { authorization: value }), `${path}: ${what}`).toEqual({ status: status.UNAUTHENTICATED });
      }
      // Past the transport's header-list bound: refused before any handler (the transport may end that connection).
      const huge = await rawCall(session, path, { authorization: `Bearer ${'x'.repeat(70_000)}` });
      expect(huge.status ?? huge.error, `${path}: 70 KB`).not.toBe(status.OK);
      session.destroy();
      session = connect(`http://${h.server.address}`);
      expect(await rawCall(session, path, { authorization: `Bearer ${token}` })).toEqual({ status: status.OK });
    }
    // Refused calls give their slot back: more of them than a connection may have unary calls in flight (256), one
    // after another on one connection, and a call with the token still goes through there.
    for (let i = 0; i < 300; i++) expect(await rawCall(session, '/rollout.v1.AdminService/GetServerState', {})).toEqual({ status: status.UNAUTHENTICATED });
    expect(await rawCall(session, '/rollout.v1.AdminService/GetServerState', { authorization: `Bearer ${ADMIN}` })).toEqual({ status: status.OK });
    expect(h.server.lifecycle.state).toBe('running');
  });

  it('a header gRPC metadata cannot carry (a token with a non-ASCII byte) is refused, logged at a bounded rate and never quoted', async () => {
    // The seam watched is grpc-js's default logger (console.error): a SPY, so a line that escapes the server's own
    // logger is seen. grpc-js wrote one unbounded stderr line per call, quoting the header — the near-token in it.
    const stderr = vi.spyOn(console, 'error').mockImplementation(() => undefined);
    const before = logs.length;
    try {
      const near = `${ADMIN}\u00e9`;
      const started = Date.now();
      for (let i = 0; i < 100; i++) {
        expect(await rawCall(session, '/rollout.v1.AdminService/GetServerState', { authorization: `Bearer ${near}` })).toEqual({ status: status.UNAUTHENTICATED });
      }
      expect(await rawCall(session, '/rollout.v1.RolloutService/ListEnvironments', { authorization: `Bearer ${TRAINER}\u0001` })).toEqual({ status: status.UNAUTHENTICATED });
      const elapsedS = (Date.now() - started) / 1000;
      const escaped = stderr.mock.calls.map((args) => args.map(String).join(' '));
      expect(escaped, 'lines written past the server logger').toEqual([]);
      const lines = logs.slice(before).split('\n').filter((l) => l.includes('request header'));
      expect(lines.length).toBeGreaterThan(0);
      // A token bucket: the burst (20), then at most 10 lines a second of the time the calls took; the rest counted.
      expect(lines.length).toBeLessThanOrEqual(20 + Math.ceil(10 * elapsedS));
      const counted = lines.reduce((sum, l) => sum + 1 + Number((JSON.parse(l) as { suppressed?: number }).suppressed ?? 0), 0);
      expect(counted).toBeLessThanOrEqual(101);
      expect(lines.every((l) => (JSON.parse(l) as { header?: string }).header === 'authorization')).toBe(true);
      expect(logs).not.toContain(ADMIN);
      expect(logs).not.toContain(TRAINER);
    } finally {
      stderr.mockRestore();
    }
  });
});

describe('AdminService.Drain called twice at once', () => {
  it('answers both (neither hangs nor is cut off by the drain it started) with the state and one deadline, and the server stops', async () => {
    const h = await startServerHarness({ config: { auth: { adminToken: ADMIN } } });
    const raw = new Client(h.server.address, credentials.createInsecure());
    try {
      const drain = (graceMs: number): Promise<DrainResponse | ServiceError> => {
        const metadata = new Metadata();
        metadata.set('authorization', `Bearer ${ADMIN}`);
        return new Promise((resolve) =>
          raw.makeUnaryRequest(
            '/rollout.v1.AdminService/Drain',
            (r: DrainRequest) => Buffer.from(DrainRequest.encode(r).finish()),
            (b: Buffer) => DrainResponse.decode(b),
            { graceMs },
            metadata,
            { deadline: Date.now() + 30_000 },
            (err, res) => resolve(err ?? res!),
          ),
        );
      };
      const answers = await within(Promise.all([drain(0), drain(0)]), 30_000, 'both Drain answers');
      for (const a of answers) {
        expect(a, JSON.stringify(a)).not.toBeInstanceOf(Error);
        expect([ServerState.SERVER_STATE_DRAINING, ServerState.SERVER_STATE_DRAINED, ServerState.SERVER_STATE_STOPPED]).toContain((a as DrainResponse).state);
      }
      expect((answers[0] as DrainResponse).deadlineUnixMs).toBe((answers[1] as DrainResponse).deadlineUnixMs);
      await within(
        new Promise<void>((resolve) => {
          const check = (): void => (h.server.lifecycle.state === 'stopped' ? resolve() : void setTimeout(check, 20));
          check();
        }),
        30_000,
        'the server to stop',
      );
    } finally {
      raw.close();
      await h.close();
    }
  }, 60_000);
});

describe('every field of the admin requests, as an attacker holding the admin token sends it', () => {
  let h: ServerHarness;
  let raw: Client;
  beforeAll(async () => {
    h = await startServerHarness({ config: { auth: { adminToken: ADMIN } } });
    raw = new Client(h.server.address, credentials.createInsecure());
  }, 60_000);
  afterAll(async () => {
    raw?.close();
    await h?.close();
  });

  /** Raw request bytes to `path` with the admin token: its code and `rollout-field` trailer. */
  const call = (path: string, bytes: Uint8Array): Promise<{ code: number; field: string }> => {
    const metadata = new Metadata();
    metadata.set('authorization', `Bearer ${ADMIN}`);
    return new Promise((resolve) =>
      raw.makeUnaryRequest(path, (b: Uint8Array) => Buffer.from(b), (b: Buffer) => b, bytes, metadata, { deadline: Date.now() + 30_000 }, (err: ServiceError | null) =>
        resolve(err ? { code: err.code, field: String(err.metadata.get('rollout-field')[0] ?? '') } : { code: status.OK, field: '' }),
      ),
    );
  };
  const url = len(1, utf8('http://127.0.0.1:9/'));
  const TWO_64 = (1n << 64n) - 1n; // a negative int32/enum on the wire is this wide too

  it('out-of-range enums, negative and huge numbers, control characters: INVALID_ARGUMENT naming the field, nothing added', async () => {
    const cases: [string, string, Uint8Array, string][] = [
      ['AddBackend', 'kind 99', encodeFields([url, varint(2, 99n)]), 'kind'],
      ['AddBackend', 'kind -1', encodeFields([url, varint(2, TWO_64)]), 'kind'],
      ['AddBackend', 'max_concurrency -1', encodeFields([url, varint(3, TWO_64)]), 'max_concurrency'],
      ['AddBackend', 'logprobs_mode 99', encodeFields([url, varint(6, 99n)]), 'logprobs_mode'],
      ['AddBackend', 'an id with a newline', encodeFields([url, len(4, utf8('a\nb'))]), 'id'],
      ['AddBackend', 'a 2 KB id', encodeFields([url, len(4, utf8('x'.repeat(2_048)))]), 'id'],
      ['AddBackend', 'an empty url', encodeFields([]), 'url'],
      ['AddBackend', 'a url with a control character in its host', encodeFields([len(1, utf8('http://127.0.0\u0000.1:9/'))]), 'url'],
      ['RemoveBackend', 'no id', encodeFields([]), 'id'],
      ['PauseGeneration', 'mode 99', encodeFields([varint(2, 99n)]), 'mode'],
      ['PauseGeneration', 'mode -1', encodeFields([varint(2, TWO_64)]), 'mode'],
      ['PauseGeneration', 'no mode', encodeFields([]), 'mode'],
      ['ResumeGeneration', 'policy_version -1', encodeFields([varint(2, TWO_64)]), 'policy_version'],
      ['ResumeGeneration', 'policy_version 2^53 + 1', encodeFields([varint(2, (1n << 53n) + 1n)]), 'policy_version'],
      ['ResumeGeneration', 'policy_version 2^63 - 1', encodeFields([varint(2, (1n << 63n) - 1n)]), 'policy_version'],
    ];
    for (const [method, what, bytes, field] of cases) {
      expect(await call(`/rollout.v1.BackendService/${method}`, bytes), `${method}: ${what}`).toEqual({ code: status.INVALID_ARGUMENT, field });
    }
    const admin = new RolloutClient(h.server.address, { adminToken: ADMIN });
    try {
      expect((await admin.listBackends()).map((b) => b.paused)).toEqual([false]);
    } finally {
      admin.close();
    }
    expect(h.server.lifecycle.state).toBe('running');
  });
});

describe('a server with an admin token and no trainer token', () => {
  it('warns at start that RolloutService is open, and RolloutService is open indeed while the admin services are not', async () => {
    let logs = '';
    const sink = new PassThrough();
    sink.on('data', (chunk: Buffer) => (logs += chunk.toString()));
    const h = await startServerHarness({ config: { auth: { adminToken: ADMIN } }, logger: createLogger({ level: 'info', destination: sink }) });
    const session = connect(`http://${h.server.address}`);
    try {
      expect(await rawCall(session, '/rollout.v1.RolloutService/ListEnvironments', {})).toEqual({ status: status.OK });
      expect(await rawCall(session, '/rollout.v1.AdminService/GetServerState', {})).toEqual({ status: status.UNAUTHENTICATED });
      const warned = logs.split('\n').filter((l) => l.includes('"level":40') && l.includes('RolloutService is open'));
      expect(warned, logs.slice(0, 2_000)).toHaveLength(1);
      expect(logs).not.toContain(ADMIN);
    } finally {
      session.destroy();
      await h.close();
    }
  }, 60_000);
});
