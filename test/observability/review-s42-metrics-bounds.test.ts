import { connect, type Socket } from 'node:net';
import { Gauge, Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import { METRICS_MAX_CONNECTIONS, startMetricsServer, type MetricsServer } from '../../src/observability/metrics.js';
import { silentLogger } from '../../src/observability/logger.js';
import { gate } from '../support/wait.js';

/**
 * The metrics endpoint's own bounds. Before: every scrape ran its own collection (a client scraping in a loop on many
 * connections ran as many at once, each walking every gauge), and connections were not limited (each one that sent
 * part of its headers was held for up to 10 s). Now scrapes during a collection share it, and at most
 * METRICS_MAX_CONNECTIONS connections are held; one more is closed at once.
 */
describe('the metrics endpoint under many scrapers', () => {
  let server: MetricsServer | undefined;
  const sockets: Socket[] = [];
  afterEach(async () => {
    for (const s of sockets.splice(0)) s.destroy();
    await server?.close();
    server = undefined;
  });

  it('scrapes that arrive during a collection share it: 20 at once, one collection, the same answer', async () => {
    const registry = new Registry();
    const slow = gate();
    let collections = 0;
    new Gauge({
      name: 'test_collections',
      help: 'collections run',
      registers: [registry],
      async collect() {
        collections++;
        await slow.promise;
        this.set(collections);
      },
    });
    server = await startMetricsServer({ registry }, { host: '127.0.0.1', port: 0, logger: silentLogger() });
    const url = `http://${server.address}/metrics`;
    // Raw connections, each with its whole request written before the collection may end: the server (this process)
    // reads them on its next polls, so all 20 are waiting on the first collection when it is let go.
    const scrapes = await Promise.all(
      Array.from(
        { length: 20 },
        () =>
          new Promise<{ done: Promise<string> }>((resolve, reject) => {
            const s = connect(server!.port, '127.0.0.1', () => {
              let answer = '';
              s.on('data', (d: Buffer) => (answer += d.toString()));
              const done = new Promise<string>((r) => s.once('close', () => r(answer)));
              s.write('GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n', () => resolve({ done }));
            });
            s.on('error', reject);
            sockets.push(s);
          }),
      ),
    );
    await new Promise((r) => setTimeout(r, 300));
    expect(collections).toBe(1);
    slow.open();
    const answers = await Promise.all(scrapes.map((x) => x.done));
    expect(collections).toBe(1);
    expect(answers.every((a) => a.startsWith('HTTP/1.1 200 '))).toBe(true);
    const bodies = answers.map((a) => a.slice(a.indexOf('\r\n\r\n')));
    expect(new Set(bodies).size).toBe(1);
    expect(bodies[0]).toMatch(/^test_collections 1$/m);
    // A scrape after the collection ended runs a new one.
    expect(await (await fetch(url)).text()).toMatch(/^test_collections 2$/m);
  });

  it(`holds at most ${METRICS_MAX_CONNECTIONS} connections: one more is closed at once; a scrape works once they go`, async () => {
    const registry = new Registry();
    server = await startMetricsServer({ registry }, { host: '127.0.0.1', port: 0, logger: silentLogger() });
    const [host, port] = [server.address.split(':')[0]!, server.port];
    const open = (): Promise<Socket> =>
      new Promise((resolve, reject) => {
        const s = connect(port, host, () => resolve(s));
        s.on('error', reject);
        sockets.push(s);
      });
    // Each sends part of a request (within the 10 s header timeout) and holds its connection.
    for (let i = 0; i < METRICS_MAX_CONNECTIONS; i++) (await open()).write('GET /metrics HTTP/1.1\r\n');
    // Node counts a connection once it has accepted it: wait until the server has taken all of them.
    await new Promise((r) => setTimeout(r, 200));
    const extra = await open();
    const closed = await new Promise<boolean>((resolve) => {
      extra.once('close', () => resolve(true));
      setTimeout(() => resolve(false), 5_000);
    });
    expect(closed).toBe(true);
    for (const s of sockets.splice(0)) s.destroy();
    await new Promise((r) => setTimeout(r, 200));
    expect((await fetch(`http://${server.address}/metrics`)).status).toBe(200);
  });
});
