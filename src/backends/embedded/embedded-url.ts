import { statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { RolloutError } from '../../errors.js';

/** The URL of the project's own tiny random-weight Qwen3 (written on first use into .cache/models). */
export const TINY_QWEN3_URL = 'embedded://tiny-qwen3';

/** What an `embedded` backend URL says: which GGUF, and how to run it. */
export interface EmbeddedModelSpec {
  /** A GGUF file on this machine, or `tiny-qwen3` for the model the project writes itself. */
  model: { kind: 'file'; path: string } | { kind: 'tiny-qwen3' };
  /** Context length of each sequence (prompt + generated tokens of one request). */
  contextSize?: number;
  /** CPU threads llama.cpp uses for one evaluation batch (default 1, see parseEmbeddedUrl). */
  threads: number;
  /** Sequences evaluated at once; requests beyond wait in FIFO order. */
  sequences?: number;
}

/** The query parameters an embedded URL may carry (see parseEmbeddedUrl); any other is refused. */
const PARAMETERS = ['contextSize', 'threads', 'sequences'] as const;

const positive = (url: URL, name: string): number | undefined => {
  const raw = url.searchParams.get(name);
  if (raw === null) return undefined;
  const n = Number(raw);
  if (!Number.isSafeInteger(n) || n < 1) throw RolloutError.invalid('url', `${name}=${raw} is not a positive integer`);
  return n;
};

/**
 * Reads an `embedded` backend URL. Two forms, both with optional query parameters `contextSize`, `threads` and
 * `sequences`:
 *
 * - `file:///abs/path/model.gguf` — a user's GGUF (any architecture this llama.cpp build supports);
 * - `embedded://tiny-qwen3` — the tiny random-weight Qwen3 with the real Qwen3 vocabulary (see tiny-qwen3.ts).
 *
 * A URL rather than a bare path keeps one `url` field for every backend kind in config and ListBackends.
 * Threads default to 1: llama.cpp's threads spin at their barriers, and a rollout server shares its cores with
 * sandboxes — measured on a busy 2-core machine, the tiny model ran at 2 ms/token on 1 thread and 44 ms/token on 2.
 * Raise it (`?threads=8`) for a real model on a machine of its own. Throws invalid_argument (field `url`) for
 * anything else, a parameter other than these three or one given twice included.
 *
 * @example
 * parseEmbeddedUrl('file:///models/qwen3-0.6b-q8_0.gguf?contextSize=8192&threads=4')
 */
export function parseEmbeddedUrl(text: string): EmbeddedModelSpec {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw RolloutError.invalid('url', `not a URL: "${text}" (embedded backends take file:///path/model.gguf or ${TINY_QWEN3_URL})`);
  }
  let model: EmbeddedModelSpec['model'];
  if (url.protocol === 'file:') model = { kind: 'file', path: fileURLToPath(new URL(url.pathname, 'file://')) };
  else if (url.protocol === 'embedded:' && url.hostname === 'tiny-qwen3') model = { kind: 'tiny-qwen3' };
  else throw RolloutError.invalid('url', `embedded backends take file:///path/model.gguf or ${TINY_QWEN3_URL}, not "${text}"`);
  // A parameter the engine does not read (a misspelt `contextsize`, `thread`) would run it on the default unnoticed.
  const seen = new Set<string>();
  for (const name of url.searchParams.keys()) {
    if (!(PARAMETERS as readonly string[]).includes(name)) {
      throw RolloutError.invalid('url', `unknown parameter "${name}" in "${text}" (embedded URLs take ${PARAMETERS.join(', ')})`);
    }
    if (seen.has(name)) throw RolloutError.invalid('url', `parameter "${name}" given twice in "${text}"`);
    seen.add(name);
  }
  const contextSize = positive(url, 'contextSize');
  const sequences = positive(url, 'sequences');
  return {
    model,
    threads: positive(url, 'threads') ?? 1,
    ...(contextSize !== undefined && { contextSize }),
    ...(sequences !== undefined && { sequences }),
  };
}

/**
 * Why the GGUF an embedded backend URL names cannot be loaded now because it is not there (no such file, or not a
 * file), or undefined when it is there (or is the project's own tiny model, written on first use). What the start-up
 * refuses: a backend that could only fail until someone notices. (A file that is there but does not load is the
 * engine's own failure: it is retried, see EmbeddedEngineClient.)
 */
export function embeddedModelFileProblem(spec: EmbeddedModelSpec): string | undefined {
  if (spec.model.kind !== 'file') return undefined;
  const { path } = spec.model;
  try {
    return statSync(path).isFile() ? undefined : `${path} is not a file`;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return code === 'ENOENT' ? `${path} does not exist` : `${path} cannot be read (${code ?? String(err)})`;
  }
}
