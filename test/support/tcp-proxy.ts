import { createServer, connect, type Server, type Socket } from 'node:net';

/**
 * TEST DOUBLE of the network between a client and a server: a TCP proxy on 127.0.0.1 that can reset its connections,
 * refuse new ones, log when a client tries to connect, drop what the client sends (an ack lost with the stream) and
 * send new connections elsewhere (a server restarted on another port).
 */
export interface Proxy {
  address: string;
  /** performance.now() of each connection attempt the proxy saw. */
  attempts: number[];
  reset(): void;
  /** While down, new connections are closed at once (the server unreachable). */
  setDown(down: boolean): void;
  /** Drops the client's bytes from now on, on the connections open now (the server hears nothing more from it). */
  muteClient(): void;
  /** Where new connections go from now on (a server restarted on another port). */
  setUpstream(address: string): void;
  close(): Promise<void>;
}

export async function proxyTo(first: string): Promise<Proxy> {
  let upstream = first;
  const sockets = new Set<Socket>();
  const mutes = new Set<() => void>();
  const attempts: number[] = [];
  let down = false;
  const server: Server = createServer((client) => {
    attempts.push(performance.now());
    client.on('error', () => undefined);
    if (down) return void client.destroy();
    const up = connect(Number(upstream.slice(upstream.lastIndexOf(':') + 1)), '127.0.0.1');
    up.on('error', () => undefined);
    sockets.add(client).add(up);
    let mute = false;
    mutes.add(() => void (mute = true));
    client.on('data', (d: Buffer) => void (mute || up.write(d)));
    up.pipe(client);
    const drop = (): void => {
      client.destroy();
      up.destroy();
      sockets.delete(client);
      sockets.delete(up);
    };
    client.on('close', drop);
    up.on('close', drop);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  const reset = (): void => {
    for (const s of [...sockets]) s.destroy();
    sockets.clear();
    mutes.clear();
  };
  return {
    address: `127.0.0.1:${port}`,
    attempts,
    reset,
    setDown: (d) => void (down = d),
    setUpstream: (address) => void (upstream = address),
    muteClient: () => {
      for (const m of mutes) m();
    },
    close: async () => {
      reset();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
