/**
 * What a bearer token may hold: printable ASCII without spaces. An HTTP/2 header value cannot carry a newline or a
 * non-ASCII character, so a token with one could never be sent by any client (grpc-js refuses to set it).
 */
export const TOKEN_PATTERN = /^[\x21-\x7e]+$/;

/** Why `token` cannot be a bearer token (never quoting it), or undefined when it can. Server config, CLI and client. */
export function tokenProblem(token: string): string | undefined {
  if (token === '') return 'must not be empty';
  if (!TOKEN_PATTERN.test(token)) return 'must be printable ASCII without spaces or control characters (an HTTP/2 header cannot carry it)';
  return undefined;
}
