import { Metadata, ServerInterceptingCall, status, type ServerInterceptor } from '@grpc/grpc-js';
import type { ServerConfig } from '../config.js';

/**
 * Bounds on what one call may hold open, for every service (ours, health, reflection), checked before any handler
 * runs:
 * - `firstMessageTimeoutMs`: a call whose first request message (or half-close) has not arrived this long after its
 *   headers is ended DEADLINE_EXCEEDED naming the key. A client that opens calls and sends nothing would otherwise
 *   hold each (its HTTP/2 stream, a Rollout stream's writer and subscription) for ever: grpc-js waits without limit.
 * - `unaryDeadlineMs`: a unary call that came without a deadline (no `grpc-timeout`) gets this one (a GetTrajectory
 *   with `wait` on a task that never finishes must not wait for ever); a call with a deadline keeps its own.
 * - `connections.maxUnaryInFlight`: unary calls one connection may have in flight; one more is RESOURCE_EXHAUSTED naming
 *   the key, at once, while other connections are served (a connection is the only identity a client has here).
 */
export function callBoundsInterceptor(calls: ServerConfig['calls'], connections: Pick<ServerConfig['connections'], 'maxUnaryInFlight'>): ServerInterceptor {
  /** Unary calls in flight per connection (by its peer address and port). */
  const unaryInFlight = new Map<string, number>();
  return (method, call) => {
    const isUnary = !method.requestStream && !method.responseStream;
    const timers: NodeJS.Timeout[] = [];
    let ended = false;
    let counted: string | undefined;
    /** Runs once, whichever way the call ends. */
    const settle = (): void => {
      if (ended) return;
      ended = true;
      for (const timer of timers) clearTimeout(timer);
      if (counted === undefined) return;
      const left = (unaryInFlight.get(counted) ?? 1) - 1;
      if (left > 0) unaryInFlight.set(counted, left);
      else unaryInFlight.delete(counted);
    };
    const end = (code: status, details: string): void => {
      settle();
      call.sendStatus({ code, details, metadata: new Metadata() });
    };
    const after = (ms: number, fn: () => void): NodeJS.Timeout => {
      const timer = setTimeout(fn, ms);
      timer.unref();
      timers.push(timer);
      return timer;
    };
    /** While the call's admission at the cap is undecided: what it received, handed on once admitted. */
    let held: (() => void)[] | undefined;
    return new ServerInterceptingCall(call, {
      start: (next) => {
        let first: NodeJS.Timeout | undefined;
        if (calls.firstMessageTimeoutMs > 0) {
          first = after(calls.firstMessageTimeoutMs, () =>
            end(status.DEADLINE_EXCEEDED, `the call's first request message (or its half-close) had not fully arrived ${calls.firstMessageTimeoutMs} ms after the call started (calls.firstMessageTimeoutMs)`),
          );
        }
        if (isUnary) {
          const { remoteAddress, remotePort } = call.getConnectionInfo();
          const key = `${remoteAddress ?? ''}:${remotePort ?? ''}`;
          const admit = (): void => {
            unaryInFlight.set(key, (unaryInFlight.get(key) ?? 0) + 1);
            counted = key;
            const deadline = call.getDeadline();
            const hasDeadline = deadline instanceof Date || Number.isFinite(deadline);
            if (!hasDeadline && calls.unaryDeadlineMs > 0) {
              after(calls.unaryDeadlineMs, () => end(status.DEADLINE_EXCEEDED, `a unary call without a deadline may take at most ${calls.unaryDeadlineMs} ms (calls.unaryDeadlineMs): set a deadline to wait longer`));
            }
          };
          if ((unaryInFlight.get(key) ?? 0) < connections.maxUnaryInFlight) admit();
          else {
            // Decided once what the connection's data brought is handled: a client that cancels calls and opens new
            // ones at once sends both in one read, and grpc-js reports the cancels a tick after the new calls start
            // (they would be refused for calls already gone). Until then nothing reaches the handler.
            held = [];
            setImmediate(() => {
              const waiting = held ?? [];
              held = undefined;
              if (ended) return;
              const open = unaryInFlight.get(key) ?? 0;
              if (open >= connections.maxUnaryInFlight) {
                end(status.RESOURCE_EXHAUSTED, `this connection has ${open} unary calls in flight, the most it may (connections.maxUnaryInFlight): wait for some to end, or open another connection`);
                return;
              }
              admit();
              for (const pass of waiting) pass();
            });
          }
        }
        const arrived = (): void => {
          if (first !== undefined) clearTimeout(first);
          first = undefined;
        };
        next({
          onReceiveMessage: (message, nextMessage) => {
            arrived();
            if (held) held.push(() => nextMessage(message));
            else nextMessage(message);
          },
          onReceiveHalfClose: (nextHalfClose) => {
            arrived();
            if (held) held.push(() => nextHalfClose());
            else nextHalfClose();
          },
          onCancel: () => settle(),
        });
      },
      sendStatus: (sent, nextStatus) => {
        settle();
        nextStatus(sent);
      },
    });
  };
}

/** The longest timeout grpc-js (1.14) reads right: it takes `grpc-timeout` as int32 milliseconds and arms one Node timer. */
const MAX_GRPC_JS_TIMEOUT_MS = 2 ** 31 - 1;
/** grpc-js's own reading of the header (server-interceptors.js), so both agree on which values are timeouts. */
const GRPC_TIMEOUT = /(\d{1,8})\s*([HMSmun])/;
const UNIT_MS: Readonly<Record<string, number>> = { H: 3_600_000, M: 60_000, S: 1_000, m: 1, u: 1e-3, n: 1e-6 };

/**
 * Makes a `grpc-timeout` longer than ~24.8 days the longest deadline grpc-js holds instead of an expired one. grpc-js
 * reads the header as `(value × unit) | 0` milliseconds: a client waiting 30 days (`720H`, what grpc core sends for a
 * Python `timeout=30 * 86400`) got a negative deadline and DEADLINE_EXCEEDED at once. The header is rewritten to
 * `2147483S` before grpc-js reads it, by a listener put ahead of grpc-js's own on each of the server's HTTP/2 servers
 * (grpc-js keeps them in a private `http2Servers` map: `false` when it no longer does, so the caller can say so).
 */
export function capLongTimeouts(server: object): boolean {
  const servers = (server as { http2Servers?: unknown }).http2Servers;
  if (!(servers instanceof Map)) return false;
  for (const http2Server of servers.keys() as Iterable<{ prependListener?: (event: 'stream', fn: (stream: unknown, headers: Record<string, unknown>) => void) => void }>) {
    if (typeof http2Server.prependListener !== 'function') return false;
    http2Server.prependListener('stream', (_stream, headers) => {
      const value = headers['grpc-timeout'];
      const match = typeof value === 'string' ? GRPC_TIMEOUT.exec(value) : null;
      if (match && Number(match[1]) * UNIT_MS[match[2]!]! > MAX_GRPC_JS_TIMEOUT_MS) headers['grpc-timeout'] = `${Math.floor(MAX_GRPC_JS_TIMEOUT_MS / 1_000)}S`;
    });
  }
  return true;
}
