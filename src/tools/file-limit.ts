import type { Sandbox } from '../sandboxes/types.js';

/**
 * Why `content` cannot be written to `path` in `sandbox`, or undefined when it can: more bytes than one process of the
 * sandbox may write to a file (`limits.maxFileMb`, RLIMIT_FSIZE). Asked before a tool writes what the model gave it
 * (a file's text, an edit's result, a code cell): past that limit the kernel kills the writer with SIGXFSZ, which the
 * sandbox reports as a killed file operation — sandbox_error, an infrastructure failure — for what is the model's own
 * request. The message is an observation the model can act on.
 */
export function fileLimitProblem(sandbox: Sandbox, path: string, content: string): string | undefined {
  const maxFileMb = sandbox.spec.limits.maxFileMb;
  // UTF-8 is at most 3 bytes per UTF-16 code unit: no need to count the bytes of a text that fits anyway.
  if (content.length * 3 <= maxFileMb * MIB) return undefined;
  const bytes = Buffer.byteLength(content, 'utf8');
  if (bytes <= maxFileMb * MIB) return undefined;
  return `${path} would be ${bytes} bytes, over the sandbox's limit of ${maxFileMb} MiB per file; nothing was written.`;
}

const MIB = 1024 * 1024;
