import { credentials, Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { PassThrough } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { parseConfig } from '../../src/config.js';
import { RolloutError } from '../../src/errors.js';
import { createLogger } from '../../src/observability/logger.js';
import { BackendKind, BackendServiceClient, type AddBackendRequest, type AddBackendResponse } from '../../gen/ts/rollout/v1/backend.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

/**
 * AddBackend's inputs: an engine URL's credentials are sent as basic auth and never shown (ListBackends, logs);
 * ids, urls and model names are bounded so ListBackends and Watch stats stay answerable; and a call that ends before
 * the engine has said what it is (an engine that does not answer) either answers within its deadline or adds
 * nothing.
 */

const ADMIN = 'backend-add-admin';

/** An http server standing in for an engine: records each request's headers; `answer` false = never answers. */
async function engineStandIn(answer: boolean): Promise<{ server: Server; url: string; seen: IncomingHttpHeaders[] }> {
  const seen: IncomingHttpHeaders[] = [];
  const server = createServer((req, res) => {
    seen.push(req.headers);
    if (answer) res.writeHead(404).end('not here');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
}

async function stop(server: Server | undefined): Promise<void> {
  if (server === undefined) return;
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
}

describe('AddBackend input', () => {
  let h: ServerHarness;
  let logs = '';
  let stub: BackendServiceClient;
  let recording: Awaited<ReturnType<typeof engineStandIn>>;
  let hanging: Awaited<ReturnType<typeof engineStandIn>>;

  beforeAll(async () => {
    const sink = new PassThrough();
    sink.on('data', (chunk: Buffer) => (logs += chunk.toString()));
    // A small message limit, so oversized ids would show at once as a ListBackends that can no longer be answered.
    h = await startServerHarness({ config: { adminToken: ADMIN, maxMessageBytes: 64 * 1024 }, logger: createLogger({ level: 'debug', destination: sink }) });
    stub = new BackendServiceClient(h.server.address, credentials.createInsecure());
    recording = await engineStandIn(true);
    hanging = await engineStandIn(false);
  }, 60_000);
  afterAll(async () => {
    stub?.close();
    await stop(recording?.server);
    await stop(hanging?.server);
    await h?.close();
  });

  const md = (): Metadata => {
    const m = new Metadata();
    m.set('authorization', `Bearer ${ADMIN}`);
    return m;
  };
  const request = (req: Partial<AddBackendRequest>): AddBackendRequest => ({ url: '', kind: BackendKind.BACKEND_KIND_VLLM, maxConcurrency: 4, id: '', model: '', logprobsMode: 0, checkAnswerId: false, ...req });
  const add = (req: Partial<AddBackendRequest>, deadlineMs = 20_000): Promise<AddBackendResponse> =>
    new Promise((resolve, reject) => stub.addBackend(request(req), md(), { deadline: Date.now() + deadlineMs }, (err, res) => (err ? reject(err) : resolve(res!))));
  const refusal = async (p: Promise<unknown>): Promise<ServiceError> =>
    (await p.then(
      () => expect.fail('expected the call to fail'),
      (e: unknown) => e,
    )) as ServiceError;
  const ids = async (): Promise<string[]> => (await h.client.listBackends()).map((b) => b.id);

  it('sends an engine URL\'s credentials as basic auth, and shows the URL without them (default id, url, logs)', async () => {
    const withCreds = recording.url.replace('http://', 'http://operator:s3cret-pass@');
    const { backend } = await add({ url: withCreds });
    expect({ id: backend?.id, url: backend?.url }).toEqual({ id: recording.url, url: recording.url });
    const listed = await h.client.listBackends();
    expect(listed.map((b) => b.id)).toContain(recording.url);
    expect(JSON.stringify(listed)).not.toContain('s3cret-pass');
    expect(JSON.stringify(listed)).not.toContain('operator');
    // The engine got the credentials (AddBackend asks it what it is; the prober asks its health).
    expect(recording.seen.length).toBeGreaterThan(0);
    for (const headers of recording.seen) expect(headers.authorization).toBe(`Basic ${Buffer.from('operator:s3cret-pass').toString('base64')}`);
    expect(logs).toContain('backend added');
    expect(logs).not.toContain('s3cret-pass');
    // The same engine again: ALREADY_EXISTS names it without the credentials.
    const again = await refusal(add({ url: withCreds }));
    expect(again.code).toBe(status.ALREADY_EXISTS);
    expect(again.details).not.toContain('s3cret-pass');
    await h.client.removeBackend(recording.url);
  });

  it('does not echo the credentials of a URL it cannot parse', async () => {
    const err = await refusal(add({ url: 'http://operator:s3cret-pass@host:notaport' }));
    expect(err.code).toBe(status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/^url: not a URL/);
    expect(err.details).not.toContain('s3cret-pass');
  });

  it('refuses an id over 256 bytes or with control characters, and a url over 2048 bytes or a model over 1024, naming the field', async () => {
    const cases: Array<[Partial<AddBackendRequest>, string]> = [
      [{ id: 'a'.repeat(40_000) }, 'id'],
      [{ id: 'é'.repeat(129) }, 'id'], // 129 characters, 258 bytes
      [{ id: 'new\nline' }, 'id'],
      [{ id: 'esc\u001b[31m' }, 'id'],
      [{ id: 'del\u007f' }, 'id'],
      [{ url: `${h.engine.url}/${'p'.repeat(2048)}` }, 'url'],
      [{ model: 'm'.repeat(1025) }, 'model'],
    ];
    for (const [req, field] of cases) {
      const err = await refusal(add({ url: h.engine.url, ...req }));
      expect({ code: status[err.code], details: err.details.slice(0, field.length + 1), field: err.metadata.get('rollout-field')[0] }).toEqual({
        code: 'INVALID_ARGUMENT',
        details: `${field}:`,
        field,
      });
    }
    // ListBackends (and Watch stats) keep working: nothing was added.
    expect(await ids()).toEqual([h.engine.url]);
    // At the bounds: accepted.
    const id = 'é'.repeat(128); // 256 bytes
    // A path prefix the fake engine does not serve (404: it cannot say which model it serves), so the 1024-byte model
    // name is not contradicted. (A query string reaches the engine since engine URLs keep it: review-s36-engine-url-paths.)
    await add({ url: `${h.engine.url}/${'q'.repeat(2048 - h.engine.url.length - 1)}`, id, model: 'm'.repeat(1024) });
    expect(await ids()).toContain(id);
    await h.client.removeBackend(id);
  });

  it('answers within the call\'s deadline for an engine that does not answer, with what is known so far', async () => {
    const started = Date.now();
    const { backend } = await add({ url: hanging.url, id: 'slow-engine' }, 1_500);
    expect(Date.now() - started).toBeLessThan(1_500);
    expect(backend).toMatchObject({ id: 'slow-engine', maxModelLen: 0 });
    expect(await ids()).toContain('slow-engine');
    await h.client.removeBackend('slow-engine');
  });

  it('takes the backend out again when its call is cancelled before it answers: a retry is not ALREADY_EXISTS', async () => {
    let cancel = (): void => undefined;
    const outcome = new Promise<ServiceError | null>((resolve) => {
      const call = stub.addBackend(request({ url: hanging.url, id: 'cancelled-engine' }), md(), { deadline: Date.now() + 20_000 }, (err) => resolve(err));
      cancel = () => call.cancel();
    });
    // While the call waits for the engine, the backend is in the pool; then the caller gives up.
    await sleep(500);
    expect(await ids()).toContain('cancelled-engine');
    cancel();
    expect((await outcome)?.code).toBe(status.CANCELLED);
    for (let i = 0; i < 100 && (await ids()).includes('cancelled-engine'); i++) await sleep(20);
    expect(await ids()).not.toContain('cancelled-engine');
    // The retry is a new add.
    await add({ url: hanging.url, id: 'cancelled-engine' }, 1_000);
    await h.client.removeBackend('cancelled-engine');
  });

  it('an add undone after its backend was removed and added again under the same id takes out only its own backend', async () => {
    // The pool is the seam: learning what an engine is, is held (an engine slow to say what it is) until the test lets
    // it go, and each removal is awaited as it ends (the undo runs after the client saw CANCELLED).
    const pool = h.server.pool;
    const learn = pool.learn.bind(pool);
    const remove = pool.remove.bind(pool);
    const held: (() => void)[] = [];
    let learning!: () => void;
    const firstLearns = new Promise<void>((resolve) => (learning = resolve));
    const removals: Promise<void>[] = [];
    const learnSpy = vi.spyOn(pool, 'learn').mockImplementation(async (id) => {
      await new Promise<void>((resolve) => {
        held.push(resolve);
        learning();
      });
      return learn(id);
    });
    const removeSpy = vi.spyOn(pool, 'remove').mockImplementation((id, options) => {
      const done = remove(id, options);
      removals.push(done.catch(() => undefined));
      return done;
    });
    try {
      let cancel = (): void => undefined;
      const outcome = new Promise<ServiceError | null>((resolve) => {
        const call = stub.addBackend(request({ url: recording.url, id: 'reused-id' }), md(), { deadline: Date.now() + 20_000 }, (err) => resolve(err));
        cancel = () => call.cancel();
      });
      await firstLearns;
      // Meanwhile the operator replaces it: removed, then another engine added under the same id.
      await h.client.removeBackend('reused-id');
      await add({ url: hanging.url, id: 'reused-id' }, 1_000);
      const before = removals.length;
      cancel();
      expect((await outcome)?.code).toBe(status.CANCELLED);
      // The first call's undo (a removal), once it has run.
      while (removals.length === before) await new Promise((resolve) => setImmediate(resolve));
      await Promise.all(removals);
      const backends = (await h.client.listBackends()).filter((b) => b.id === 'reused-id');
      expect(backends.map((b) => b.url)).toEqual([hanging.url]);
    } finally {
      for (const release of held) release();
      learnSpy.mockRestore();
      removeSpy.mockRestore();
      if ((await ids()).includes('reused-id')) await h.client.removeBackend('reused-id');
    }
  });
});

describe('config backends', () => {
  const refused = (backend: Record<string, unknown>): { field: string | undefined; message: string } => {
    try {
      parseConfig({ backends: [backend] });
    } catch (err) {
      expect(err).toBeInstanceOf(RolloutError);
      return { field: (err as RolloutError).field, message: (err as Error).message };
    }
    return expect.fail('expected the config to be refused');
  };

  it('default the id to the url without its credentials (the url itself when it has none)', () => {
    const { backends } = parseConfig({ backends: [{ url: 'http://operator:s3cret@gpu-1:8000' }, { url: 'http://gpu-2:8000/' }, { url: 'http://gpu-3:8000', id: 'three' }] });
    expect(backends.map((b) => [b.id, b.url])).toEqual([
      ['http://gpu-1:8000', 'http://operator:s3cret@gpu-1:8000'],
      ['http://gpu-2:8000/', 'http://gpu-2:8000/'],
      ['three', 'http://gpu-3:8000'],
    ]);
  });

  it('are bounded as AddBackend is: id (256 bytes, no control characters), url (2048 bytes), model (1024 bytes)', () => {
    expect(refused({ url: 'http://gpu:8000', id: 'a'.repeat(257) })).toMatchObject({ field: 'backends.0.id', message: expect.stringContaining('at most 256 bytes') });
    expect(refused({ url: 'http://gpu:8000', id: 'tab\there' })).toMatchObject({ field: 'backends.0.id', message: expect.stringContaining('control characters') });
    expect(refused({ url: `http://gpu:8000/${'p'.repeat(2048)}` })).toMatchObject({ field: 'backends.0.url', message: expect.stringContaining('at most 2048 bytes') });
    expect(refused({ url: 'http://gpu:8000', model: 'm'.repeat(1025) })).toMatchObject({ field: 'backends.0.model' });
  });
});
