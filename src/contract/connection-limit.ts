import type { Logger } from '../observability/logger.js';
import { RateLimitedLog } from '../observability/rate-limited-log.js';

interface Peer {
  remoteAddress?: string;
  remotePort?: number;
}
interface RawSocket extends Peer {
  destroy(): void;
  once(event: 'close', fn: () => void): unknown;
}
interface Session {
  socket?: Peer;
  once(event: 'remoteSettings', fn: () => void): unknown;
}
/** What a listening server of grpc-js is to us: a net.Server (http2.Http2Server or Http2SecureServer). */
interface Listener {
  maxConnections?: number;
  on(event: 'drop', fn: (data?: Peer) => void): unknown;
  on(event: 'connection', fn: (socket: RawSocket) => void): unknown;
  on(event: 'session', fn: (session: Session) => void): unknown;
}

export interface ConnectionLimits {
  /** Connections open at once per listening address (`connections.maxOpen`). */
  maxOpen: number;
  /** Time from TCP accept to the client's HTTP/2 SETTINGS, TLS handshake included (`connections.handshakeTimeoutMs`); 0 = none. */
  handshakeTimeoutMs: number;
}

/** A connection's key while it is open: its peer's address and port (unique among one listener's connections). */
const peerKey = (p: Peer): string => `${p.remoteAddress ?? ''}|${p.remotePort ?? ''}`;

/**
 * Bounds the connections of the grpc-js server's listening addresses:
 * - at most `maxOpen` open at once on each: node's `net.Server.maxConnections` closes one more as it is accepted —
 *   before TLS, HTTP/2 or any of our code — and says so on 'drop', which is logged, rate-limited;
 * - a connection whose client has not completed its TLS handshake and sent its HTTP/2 SETTINGS `handshakeTimeoutMs`
 *   after it was accepted is destroyed: grpc-js's idle timeout (`connections.idleTimeoutMs`) starts only with an
 *   HTTP/2 session, so a TCP connection that never speaks would otherwise hold its place for ever.
 * grpc-js keeps its HTTP/2 servers in a private map (as for capLongTimeouts): false when that changed, so the caller
 * can warn that connections are not bounded.
 */
export function limitConnections(server: object, limits: ConnectionLimits, logger: Logger): boolean {
  const servers = (server as { http2Servers?: unknown }).http2Servers;
  if (!(servers instanceof Map) || servers.size === 0) return false;
  const listeners = [...(servers.keys() as Iterable<Listener>)];
  if (!listeners.every((l) => typeof l.on === 'function')) return false;
  const refusals = new RateLimitedLog(logger);
  for (const listener of listeners) {
    listener.maxConnections = limits.maxOpen;
    listener.on('drop', (data) => refusals.write('warn', { peer: data?.remoteAddress, maxOpen: limits.maxOpen }, 'connection refused: connections.maxOpen connections are open on this address'));
    if (limits.handshakeTimeoutMs <= 0) continue;
    // Accepted connections whose client has not sent its HTTP/2 settings yet, by peer.
    const pending = new Map<string, NodeJS.Timeout>();
    listener.on('connection', (socket) => {
      const key = peerKey(socket);
      const timer = setTimeout(() => {
        pending.delete(key);
        refusals.write('warn', { peer: socket.remoteAddress, handshakeTimeoutMs: limits.handshakeTimeoutMs }, 'connection closed: no TLS handshake and HTTP/2 settings within connections.handshakeTimeoutMs');
        socket.destroy();
      }, limits.handshakeTimeoutMs);
      timer.unref();
      pending.set(key, timer);
      socket.once('close', () => {
        clearTimeout(timer);
        if (pending.get(key) === timer) pending.delete(key);
      });
    });
    listener.on('session', (session) => {
      session.once('remoteSettings', () => {
        const key = session.socket && peerKey(session.socket);
        if (key === undefined) return;
        clearTimeout(pending.get(key));
        pending.delete(key);
      });
    });
  }
  return true;
}
