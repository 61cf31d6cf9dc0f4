import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * TEST DOUBLE: an engine stand-in (a raw HTTP server) whose requests are parked with their responses until the test
 * answers them, as it likes: headers then nothing (a stalled engine), a trickle, a whole answer.
 */
export async function parkingServer(): Promise<{ url: string; server: Server; parked: ServerResponse[] }> {
  const parked: ServerResponse[] = [];
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => parked.push(res));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server, parked };
}
