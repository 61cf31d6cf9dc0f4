import { createHash } from 'node:crypto';
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { RolloutError, throwIfAborted } from '../../../errors.js';

/** The project's index (PEP 503/691 "simple" API): PyPI unless PIP_INDEX_URL names a mirror. */
export function defaultIndexUrl(): string {
  return (process.env.PIP_INDEX_URL ?? 'https://pypi.org/simple').replace(/\/+$/, '');
}

const projectPage = z.object({
  files: z.array(z.object({ filename: z.string(), url: z.string(), hashes: z.record(z.string(), z.string()).default({}) })),
});

export interface FetchSdistOptions {
  project: string;
  filename: string;
  /** The file's pinned SHA-256: the download must match it, whatever the index says. */
  sha256: string;
  /** Downloads are kept here as `<filename>`; a file already there with the right hash is not fetched again. */
  cacheDir: string;
  indexUrl?: string;
  signal?: AbortSignal;
  onProgress?: (message: string) => void;
}

/**
 * A source distribution from the package index, by the same API pip uses (the JSON form of the simple index,
 * PEP 691): the project's page gives the file's URL, the bytes must hash to the pinned SHA-256. Why not
 * `pip download --no-binary :all:`: pip prepares metadata by running the sdist's build backend, which needs the
 * backend (flit_core, hatchling...) installed on the host; only the archive is needed here. Returns the path.
 */
export async function fetchSdist(options: FetchSdistOptions): Promise<string> {
  const path = join(options.cacheDir, options.filename);
  const cached = await readFile(path).catch(() => undefined);
  if (cached && sha256(cached) === options.sha256) return path;
  throwIfAborted(options.signal);
  const index = (options.indexUrl ?? defaultIndexUrl()).replace(/\/+$/, '');
  const normalized = options.project.toLowerCase().replace(/[-_.]+/g, '-');
  const pageUrl = `${index}/${normalized}/`;
  options.onProgress?.(`looking up ${options.filename} at ${pageUrl}`);
  const page = await get(pageUrl, { accept: 'application/vnd.pypi.simple.v1+json' }, options.signal);
  const parsed = projectPage.safeParse(JSON.parse(page.toString('utf8')));
  if (!parsed.success) throw new RolloutError('unavailable', `${pageUrl} did not answer with the simple index's JSON form`);
  const file = parsed.data.files.find((f) => f.filename === options.filename);
  if (!file) throw new RolloutError('not_found', `${options.filename} is not on ${pageUrl}`);
  if (file.hashes.sha256 !== undefined && file.hashes.sha256 !== options.sha256) {
    throw new RolloutError('failed_precondition', `${options.filename}: the index says sha256 ${file.hashes.sha256}, the task pins ${options.sha256}`);
  }
  options.onProgress?.(`downloading ${options.filename}`);
  const bytes = await get(new URL(file.url, pageUrl).toString(), {}, options.signal);
  const actual = sha256(bytes);
  if (actual !== options.sha256) throw new RolloutError('failed_precondition', `${options.filename}: downloaded bytes hash to ${actual}, the task pins ${options.sha256}`);
  await mkdir(options.cacheDir, { recursive: true });
  const partial = `${path}.partial-${process.pid}`;
  await writeFile(partial, bytes);
  await rename(partial, path);
  return path;
}

async function get(url: string, headers: Record<string, string>, signal: AbortSignal | undefined): Promise<Buffer> {
  let response: Response;
  try {
    response = await fetch(url, { headers, signal: signal ?? null, redirect: 'follow' });
  } catch (err) {
    throwIfAborted(signal);
    throw new RolloutError('unavailable', `cannot fetch ${url}: ${(err as Error).message}`, { cause: err });
  }
  if (!response.ok) throw new RolloutError('unavailable', `${url} answered HTTP ${response.status}`);
  return Buffer.from(await response.arrayBuffer());
}

function sha256(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}
