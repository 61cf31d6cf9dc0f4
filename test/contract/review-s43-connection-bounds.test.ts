import { credentials, loadPackageDefinition, type ChannelCredentials } from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import { protoPath } from 'grpc-health-check';
import { connect as http2Connect } from 'node:http2';
import { connect, type Socket } from 'node:net';
import { PassThrough } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { startRolloutServer, type RolloutServer } from '../../src/app.js';
import { createLogger } from '../../src/observability/logger.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { makeTestCerts } from '../support/test-certs.js';
import { eventually, within } from '../support/wait.js';

/**
 * Connections in number and in time. Before, each connection was bounded in its calls and streams but nothing bounded
 * the connections: a client opening TCP connections in a loop (each sending nothing, or an HTTP/2 preface and no
 * call) kept every one, until the server ran out of file descriptors — and then sandboxes, engine connections and the
 * journal failed, reported as infrastructure errors of trainers' tasks. Now `connections.maxOpen` closes one more as
 * it is accepted (logged), and `connections.idleTimeoutMs` closes a connection with no call open (HTTP/2 GOAWAY).
 */
type Ctor<T> = new (address: string, credentials: ChannelCredentials) => T;
interface HealthClient {
  check(request: { service: string }, options: { deadline: number }, callback: (err: (Error & { code?: number }) | null, res?: { status: string }) => void): void;
  close(): void;
}
const healthPkg = loadPackageDefinition(loadSync(protoPath, { enums: String })) as unknown as { grpc: { health: { v1: { Health: Ctor<HealthClient> } } } };

function check(address: string): Promise<string> {
  const client = new healthPkg.grpc.health.v1.Health(address, credentials.createInsecure());
  return new Promise<string>((resolve) =>
    client.check({ service: '' }, { deadline: Date.now() + 3_000 }, (err, res) => {
      client.close();
      resolve(err ? `error ${err.code}` : (res?.status ?? 'no answer'));
    }),
  );
}

/** A TCP connection and a promise of its close (the peer's or ours). */
async function open(address: string): Promise<{ socket: Socket; closed: Promise<void> }> {
  const [host, port] = [address.slice(0, address.lastIndexOf(':')), Number(address.slice(address.lastIndexOf(':') + 1))];
  const socket = connect(port, host);
  socket.on('error', () => undefined);
  socket.resume(); // a paused socket never sees the server's FIN (no 'end', no 'close')
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  return { socket, closed };
}

describe('connections (connections.maxOpen, connections.idleTimeoutMs)', () => {
  let server: RolloutServer | undefined;
  const sockets: Socket[] = [];
  afterEach(async () => {
    for (const s of sockets.splice(0)) s.destroy();
    await server?.shutdown();
    server = undefined;
  });

  async function start(connections: { maxOpen?: number; idleTimeoutMs?: number; handshakeTimeoutMs?: number }, tls?: { certFile: string; keyFile: string }): Promise<{ address: string; log: () => string }> {
    let log = '';
    const destination = new PassThrough();
    destination.on('data', (d: Buffer) => (log += d.toString()));
    server = await startRolloutServer({ port: 0, backends: [], tokenWorkers: { count: 0 }, connections, ...(tls && { tls }) }, { logger: createLogger({ level: 'info', destination }), sandboxes: new NullSandboxDriver() });
    return { address: server.address, log: () => log };
  }

  it('one connection past maxOpen is closed as it is accepted, logged; a place given back is taken again', async () => {
    const { address, log } = await start({ maxOpen: 3 });
    const held = await Promise.all([open(address), open(address), open(address)]);
    sockets.push(...held.map((h) => h.socket));
    // The fourth is accepted by the kernel and closed by the server at once, without a byte.
    const extra = await open(address);
    sockets.push(extra.socket);
    await within(extra.closed, 5_000, 'the connection past maxOpen to be closed');
    // A client's channel is refused too while the three are held (UNAVAILABLE = 14), and the server says why.
    expect(await check(address)).toBe('error 14');
    await eventually(() => log().includes('connections.maxOpen'), 'the refusal to be logged', 5_000);
    // The three held ones were left alone.
    let heldClosed = 0;
    for (const h of held) void h.closed.then(() => heldClosed++);
    await new Promise((r) => setTimeout(r, 200));
    expect(heldClosed).toBe(0);
    // One given back: a client is served again.
    held[0]!.socket.destroy();
    await held[0]!.closed;
    await eventually(async () => (await check(address)) === 'SERVING', 'a client to be served once a place was given back', 10_000);
  }, 60_000);

  it('a connection with no call open is closed after idleTimeoutMs (GOAWAY); one with a call open is not', async () => {
    const { address } = await start({ idleTimeoutMs: 500 });
    // An HTTP/2 connection that never makes a call: GOAWAY, then closed.
    const idle = http2Connect(`http://${address}`);
    idle.on('error', () => undefined);
    const goaway = new Promise<void>((resolve) => idle.once('goaway', () => resolve()));
    const idleClosed = new Promise<void>((resolve) => idle.once('close', () => resolve()));
    await within(goaway, 10_000, 'the idle connection to get a GOAWAY');
    await within(idleClosed, 10_000, 'the idle connection to be closed');
    // A connection whose stream stays open (a health Watch here) is not idle, however long.
    const busy = http2Connect(`http://${address}`);
    busy.on('error', () => undefined);
    let busyGoaway = false;
    busy.on('goaway', () => (busyGoaway = true));
    const stream = busy.request({ ':method': 'POST', ':path': '/grpc.health.v1.Health/Watch', 'content-type': 'application/grpc', te: 'trailers' });
    stream.on('error', () => undefined);
    stream.on('data', () => undefined);
    // The request: a zero-length Health request message (service ""), not half-closed (a server stream's client may).
    stream.write(Buffer.from([0, 0, 0, 0, 0]));
    await new Promise((r) => setTimeout(r, 2_000));
    expect(busyGoaway).toBe(false);
    expect(busy.closed).toBe(false);
    stream.close();
    busy.close();
  }, 60_000);

  it('a TCP connection that never completes HTTP/2 is closed after handshakeTimeoutMs; a client that does is kept', async () => {
    const { address, log } = await start({ handshakeTimeoutMs: 500, idleTimeoutMs: 0 });
    const silent = await open(address);
    sockets.push(silent.socket);
    // One that sends only part of the preface is no better.
    const partial = await open(address);
    sockets.push(partial.socket);
    partial.socket.write('PRI * HTTP/2.0\r\n');
    // A real HTTP/2 client, idle after its settings (idleTimeoutMs 0: never closed for that).
    const client = http2Connect(`http://${address}`);
    client.on('error', () => undefined);
    await new Promise<void>((resolve) => client.once('remoteSettings', () => resolve()));
    await within(Promise.all([silent.closed, partial.closed]), 10_000, 'the connections that never spoke HTTP/2 to be closed');
    await eventually(() => log().includes('connections.handshakeTimeoutMs'), 'the close to be logged', 5_000);
    await new Promise((r) => setTimeout(r, 1_000));
    expect(client.closed || client.destroyed).toBe(false);
    client.close();
  }, 30_000);

  it('over TLS: a connection that never starts its handshake is closed after handshakeTimeoutMs, a TLS client is served and kept', async () => {
    const certs = await makeTestCerts();
    try {
      const { address } = await start({ handshakeTimeoutMs: 500, idleTimeoutMs: 0 }, { certFile: certs.serverCertFile, keyFile: certs.serverKeyFile });
      const silent = await open(address);
      sockets.push(silent.socket);
      const client = http2Connect(`https://${address}`, { ca: certs.ca, servername: 'localhost' });
      client.on('error', () => undefined);
      await within(new Promise<void>((resolve) => client.once('remoteSettings', () => resolve())), 10_000, 'the TLS client to get the server settings');
      await within(silent.closed, 10_000, 'the silent connection to be closed');
      await new Promise((r) => setTimeout(r, 1_000));
      expect(client.closed || client.destroyed).toBe(false);
      client.close();
    } finally {
      await certs.remove();
    }
  }, 60_000);
});
