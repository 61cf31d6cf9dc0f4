import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { checkEquivalence } from '../../src/environments/math/equivalence.js';
import { findMathVerify, mathVerifyMounts, runMathVerify, type MathVerifyInstallation, type MathVerifyPair, type MathVerifyVerdict } from '../../src/environments/math/math-verify-checker.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import { defaultImagePath } from '../../src/sandboxes/images/image-recipe.js';
import type { Sandbox } from '../../src/sandboxes/types.js';

/**
 * Agreement between the built-in checker and math-verify on a corpus of answer pairs: both run on every pair
 * (math-verify in a real bubblewrap sandbox, as the math environment runs it), and the report says how often they
 * agree, per category, and lists every disagreement. Used by bench/math-agreement.ts (prints) and by
 * test/environments/math/agreement.test.ts (asserts a floor).
 */

/** One corpus line: a reference answer, a model answer, and what kind of answer it is. */
export interface AnswerPair {
  category: string;
  gold: string;
  pred: string;
}

/** The corpus the project authored (test/environments/math/fixtures/answer-pairs.jsonl). */
export const DEFAULT_CORPUS = fileURLToPath(new URL('../../test/environments/math/fixtures/answer-pairs.jsonl', import.meta.url));

export function loadAnswerPairs(path = DEFAULT_CORPUS): AnswerPair[] {
  return readFileSync(path, 'utf8')
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line) as AnswerPair);
}

export interface Disagreement {
  pair: AnswerPair;
  builtin: boolean;
  builtinRule: string;
  mathVerify: boolean;
  parsed: { gold: string[]; pred: string[] };
}

export interface AgreementReport {
  total: number;
  agree: number;
  /** agree / total. */
  rate: number;
  /** Pairs each checker called equivalent. */
  equivalent: { builtin: number; mathVerify: number };
  byCategory: Record<string, { total: number; agree: number }>;
  disagreements: Disagreement[];
}

/** Compares the built-in checker's verdicts on `pairs` with math-verify's `verdicts` (same order). */
export function agreementReport(pairs: readonly AnswerPair[], verdicts: readonly MathVerifyVerdict[]): AgreementReport {
  const report: AgreementReport = { total: pairs.length, agree: 0, rate: 0, equivalent: { builtin: 0, mathVerify: 0 }, byCategory: {}, disagreements: [] };
  pairs.forEach((pair, i) => {
    const verdict = verdicts[i]!;
    const builtin = checkEquivalence(pair.pred, pair.gold);
    const category = (report.byCategory[pair.category] ??= { total: 0, agree: 0 });
    category.total++;
    if (builtin.equivalent) report.equivalent.builtin++;
    if (verdict.equivalent) report.equivalent.mathVerify++;
    if (builtin.equivalent === verdict.equivalent) {
      report.agree++;
      category.agree++;
    } else {
      report.disagreements.push({ pair, builtin: builtin.equivalent, builtinRule: builtin.method, mathVerify: verdict.equivalent, parsed: { gold: verdict.gold, pred: verdict.pred } });
    }
  });
  report.rate = report.total === 0 ? 1 : report.agree / report.total;
  return report;
}

/**
 * Runs `fn` with a bubblewrap sandbox that has math-verify bound in (the default .sif image when built, else the
 * host layout), no network, 1 GiB; stops it afterwards. Throws when math-verify is not installed.
 */
export async function withMathVerifySandbox<T>(fn: (sandbox: Sandbox) => Promise<T>, installation = findMathVerify()): Promise<T> {
  if (!installation) throw new Error('math-verify is not installed: run scripts/setup.sh (or set ROLLOUT_MATH_VERIFY_VENV)');
  const driver = new BubblewrapDriver();
  const image = existsSync(defaultImagePath()) ? defaultImagePath() : undefined;
  const sandbox = await driver.start({
    image,
    network: false,
    mounts: mathVerifyMounts(installation),
    env: {},
    workdir: '/work',
    limits: { memoryMb: 1024, maxProcesses: 64, diskMb: 64, wallClockMs: 600_000, commandTimeoutMs: 300_000, outputLimitBytes: 4 << 20, maxFileMb: 16 },
  });
  try {
    return await fn(sandbox);
  } finally {
    await sandbox.stop();
    await driver.close?.();
  }
}

/** Both checkers on `pairs`; math-verify in one batch in one sandbox. */
export async function measureAgreement(pairs: readonly AnswerPair[], installation?: MathVerifyInstallation): Promise<AgreementReport> {
  const verdicts = await withMathVerifySandbox(
    (sandbox) => runMathVerify(sandbox, pairs.map((p): MathVerifyPair => ({ gold: p.gold, pred: p.pred })), { timeoutMs: 300_000 }),
    installation,
  );
  return agreementReport(pairs, verdicts);
}
