import { readFileSync } from 'node:fs';
import { createSecureContext } from 'node:tls';
import { connectivityState, type Client } from '@grpc/grpc-js';
import { InvalidArgumentError, type Command } from 'commander';
import { RolloutClient, type ConnectionOptions } from '../client/rollout-client.js';
import { tokenProblem } from '../bearer-token.js';
import { RolloutError } from '../errors.js';

/** The flags every client command takes to reach a server that asks for tokens or TLS (see {@link withConnectionFlags}). */
export interface ConnectionFlags {
  tokenFile?: string;
  adminToken?: string;
  adminTokenFile?: string;
  tlsCa?: string;
  tlsCert?: string;
  tlsKey?: string;
  /** How long to wait for the server to answer the connection before giving up (default {@link DEFAULT_CONNECT_TIMEOUT_MS}). */
  connectTimeoutMs?: number;
}

/**
 * How long a client command waits for a server to answer its connection. A refused connection fails at once; this
 * bounds the other case, a connection nobody answers (a firewall dropping packets, a port that is not gRPC), which
 * would otherwise wait forever.
 */
export const DEFAULT_CONNECT_TIMEOUT_MS = 20_000;

/**
 * Adds the connection flags to a client command: tokens from files (or ROLLOUT_TOKEN / ROLLOUT_ADMIN_TOKEN), never
 * literals for the RolloutService token (a literal shows in process listings); TLS with the server's CA, and a client
 * certificate for a server that requires one (mTLS).
 */
export function withConnectionFlags(command: Command, options: { admin?: boolean } = {}): Command {
  command
    .option('--token-file <file>', 'RolloutService bearer token from this file (or ROLLOUT_TOKEN)')
    .option('--tls-ca <file>', "connect with TLS, trusting this PEM CA for the server's certificate")
    .option('--tls-cert <file>', 'client certificate (PEM) for a server that requires one (with --tls-key)')
    .option('--tls-key <file>', 'private key (PEM) of --tls-cert')
    .option('--connect-timeout-ms <ms>', `give up when the server has not answered the connection by then (default ${DEFAULT_CONNECT_TIMEOUT_MS})`, positiveMs);
  if (options.admin) command.option('--admin-token-file <file>', 'BackendService/AdminService bearer token from this file (or ROLLOUT_ADMIN_TOKEN)');
  return command;
}

/**
 * The bearer tokens the flags and the environment give, client and server alike: a file wins over a literal
 * (`--admin-token`, kept for compatibility), which wins over ROLLOUT_TOKEN / ROLLOUT_ADMIN_TOKEN. Every token is
 * checked where it comes from: printable ASCII without spaces (what an HTTP/2 header can carry), else
 * invalid_argument naming the flag or variable, never quoting the token. A variable set to the empty string is an
 * error too: on a server it would silently mean no token at all.
 */
export function tokensFrom(flags: Pick<ConnectionFlags, 'tokenFile' | 'adminToken' | 'adminTokenFile'>): { token?: string; adminToken?: string } {
  const token = flags.tokenFile !== undefined ? readSecret(flags.tokenFile, '--token-file') : fromEnvironment('ROLLOUT_TOKEN');
  const adminToken =
    flags.adminTokenFile !== undefined
      ? readSecret(flags.adminTokenFile, '--admin-token-file')
      : flags.adminToken !== undefined
        ? checkedToken(flags.adminToken, '--admin-token')
        : fromEnvironment('ROLLOUT_ADMIN_TOKEN');
  return { ...(token !== undefined && { token }), ...(adminToken !== undefined && { adminToken }) };
}

/** The token in an environment variable, undefined when unset; set but empty or unsendable is invalid_argument. */
function fromEnvironment(name: 'ROLLOUT_TOKEN' | 'ROLLOUT_ADMIN_TOKEN'): string | undefined {
  const value = process.env[name];
  if (value === undefined) return undefined;
  if (value === '') throw new RolloutError('invalid_argument', `${name} is set but empty: give the token, or unset it for no token`);
  return checkedToken(value, name);
}

/** `token` when it can be a bearer token; otherwise invalid_argument naming `source` (a flag or variable), not the token. */
function checkedToken(token: string, source: string): string {
  const problem = tokenProblem(token);
  if (problem !== undefined) throw new RolloutError('invalid_argument', `${source}: the token ${problem}`);
  return token;
}

function positiveMs(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`not a positive integer: ${value}`);
  return n;
}

/** The client's ConnectionOptions from the flags and the environment; throws invalid_argument naming a bad flag. */
export function connectionOptions(flags: ConnectionFlags): ConnectionOptions {
  if ((flags.tlsCert === undefined) !== (flags.tlsKey === undefined)) {
    throw new RolloutError('invalid_argument', '--tls-cert and --tls-key go together');
  }
  const useTls = flags.tlsCa !== undefined || flags.tlsCert !== undefined;
  if (!useTls) return tokensFrom(flags);
  const ca = flags.tlsCa !== undefined ? readFlagFile(flags.tlsCa, '--tls-ca') : undefined;
  const cert = flags.tlsCert !== undefined ? readFlagFile(flags.tlsCert, '--tls-cert') : undefined;
  const key = flags.tlsKey !== undefined ? readFlagFile(flags.tlsKey, '--tls-key') : undefined;
  // grpc-js would throw from inside its channel (a stack trace) on a file that is not PEM; OpenSSL ignores a CA file
  // without a certificate in it, which would then fail every handshake with a message about the server.
  if (ca !== undefined && !ca.includes('-----BEGIN CERTIFICATE-----')) {
    throw new RolloutError('invalid_argument', `--tls-ca ${flags.tlsCa}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)`);
  }
  if (cert !== undefined && key !== undefined) {
    try {
      createSecureContext({ cert, key });
    } catch (err) {
      throw new RolloutError('invalid_argument', `--tls-cert ${flags.tlsCert}, --tls-key ${flags.tlsKey}: not a usable PEM certificate and key (${(err as Error).message})`);
    }
  }
  return { ...tokensFrom(flags), tls: { ...(ca && { ca }), ...(cert && { cert }), ...(key && { key }) } };
}

/** A client for the server at `address` (given by `flag`), or invalid_argument naming the flag when it cannot be one. */
export function connect(address: string, flag: string, options: ConnectionOptions): RolloutClient {
  if (address.trim() === '') throw new RolloutError('invalid_argument', `${flag}: empty: give host:port`);
  try {
    return new RolloutClient(address, options);
  } catch (err) {
    throw new RolloutError('invalid_argument', `${flag} ${address}: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * `call`, unless the server has not answered the connection within the timeout: then unavailable naming the address.
 * Calls fail at once on a refused connection (they do not wait for the server), so only a connection that is neither
 * refused nor answered is cut short here; once connected, keepalive pings bound a server that goes silent.
 */
export async function withinConnectTimeout<T>(stub: Client, address: string, flags: Pick<ConnectionFlags, 'connectTimeoutMs'>, call: Promise<T>): Promise<T> {
  const ms = flags.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
  let timer: NodeJS.Timeout | undefined;
  // A plain timer, not grpc-js's waitForReady: its deadline timer survives client.close() and kept the process alive.
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      if (stub.getChannel().getConnectivityState(false) === connectivityState.READY) return; // connected: the call's own time
      reject(new RolloutError('unavailable', `cannot reach a gRPC server at ${address} within ${ms / 1000} s (nothing answered the connection)`));
    }, ms);
  });
  try {
    return await Promise.race([call, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** A token file's content, trimmed; invalid_argument naming the flag (never quoting the file) when unreadable, empty or unsendable. */
function readSecret(file: string, flag: string): string {
  const text = readFlagFile(file, flag).toString('utf8').trim();
  if (text === '') throw new RolloutError('invalid_argument', `${flag}: ${file} is empty`);
  return checkedToken(text, `${flag} ${file}`);
}

function readFlagFile(file: string, flag: string): Buffer {
  try {
    return readFileSync(file);
  } catch (err) {
    throw new RolloutError('invalid_argument', `${flag}: cannot read ${file}: ${(err as Error).message}`);
  }
}
