import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import type { ConnectionOptions } from '../client/rollout-client.js';
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
}

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
    .option('--tls-key <file>', 'private key (PEM) of --tls-cert');
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

/** The client's ConnectionOptions from the flags and the environment; throws invalid_argument naming a bad flag. */
export function connectionOptions(flags: ConnectionFlags): ConnectionOptions {
  if ((flags.tlsCert === undefined) !== (flags.tlsKey === undefined)) {
    throw new RolloutError('invalid_argument', '--tls-cert and --tls-key go together');
  }
  const useTls = flags.tlsCa !== undefined || flags.tlsCert !== undefined;
  return {
    ...tokensFrom(flags),
    ...(useTls && {
      tls: {
        ...(flags.tlsCa !== undefined && { ca: readFlagFile(flags.tlsCa, '--tls-ca') }),
        ...(flags.tlsCert !== undefined && { cert: readFlagFile(flags.tlsCert, '--tls-cert') }),
        ...(flags.tlsKey !== undefined && { key: readFlagFile(flags.tlsKey, '--tls-key') }),
      },
    }),
  };
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
