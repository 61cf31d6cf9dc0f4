import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** grpcurl as scripts/setup.sh builds it (pinned there) from the Go module proxy. */
export const GRPCURL = fileURLToPath(new URL('../../.cache/bin/grpcurl', import.meta.url));

export interface GrpcurlResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Fails (never skips) when grpcurl was not built: the reflection contract is then untested. */
export function requireGrpcurl(): void {
  if (!existsSync(GRPCURL)) throw new Error(`${GRPCURL} missing: ./scripts/setup.sh builds it with the Go toolchain (go install, Go module proxy)`);
}

/** Runs grpcurl with plaintext against `address`; args go before the address, `trailing` after it (method, list/describe and symbol). */
export function grpcurl(address: string, args: readonly string[], trailing: readonly string[]): Promise<GrpcurlResult> {
  return new Promise((resolve, reject) => {
    execFile(GRPCURL, ['-plaintext', ...args, address, ...trailing], { timeout: 60_000, maxBuffer: 64 << 20 }, (error, stdout, stderr) => {
      if (error && typeof error.code !== 'number') return reject(error);
      resolve({ code: typeof error?.code === 'number' ? error.code : 0, stdout, stderr });
    });
  });
}

/**
 * Invokes `method` (`pkg.Service/Method`) by reflection alone (no -proto/-protoset), sending `body` as JSON with
 * default values emitted in the answer; resolves the parsed JSON answer, rejects with grpcurl's stderr.
 */
export async function invoke<T>(address: string, method: string, body: unknown, headers: readonly string[] = []): Promise<T> {
  const result = await invokeRaw(address, method, body, headers);
  if (result.code !== 0) throw new Error(`grpcurl ${method} exited ${result.code}: ${result.stderr}`);
  return JSON.parse(result.stdout) as T;
}

export function invokeRaw(address: string, method: string, body: unknown, headers: readonly string[] = []): Promise<GrpcurlResult> {
  const headerArgs = headers.flatMap((h) => ['-H', h]);
  return grpcurl(address, ['-emit-defaults', ...headerArgs, '-d', JSON.stringify(body)], [method]);
}
