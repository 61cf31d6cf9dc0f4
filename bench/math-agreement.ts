/**
 * The built-in math checker against math-verify (run in a bubblewrap sandbox) on a corpus of answer pairs: prints
 * the agreement rate, per category, and every disagreement. Needs math-verify installed (scripts/setup.sh).
 *
 *   npx tsx bench/math-agreement.ts [--corpus test/environments/math/fixtures/answer-pairs.jsonl]
 */
import { Command } from 'commander';
import { DEFAULT_CORPUS, loadAnswerPairs, measureAgreement } from './math/agreement.js';

const options = new Command()
  .name('math-agreement')
  .description('Agreement of the built-in math checker with math-verify on a corpus of answer pairs.')
  .option('--corpus <file>', 'JSONL of {category, gold, pred}', DEFAULT_CORPUS)
  .parse()
  .opts<{ corpus: string }>();

const pairs = loadAnswerPairs(options.corpus);
const started = performance.now();
const report = await measureAgreement(pairs);
const seconds = (performance.now() - started) / 1000;
const pct = (a: number, b: number): string => `${((100 * a) / b).toFixed(1)}%`;
console.log(`corpus ${options.corpus}: ${report.total} pairs; math-verify took ${seconds.toFixed(1)} s (one sandbox, one process)`);
console.log(`agreement: ${report.agree}/${report.total} = ${pct(report.agree, report.total)}`);
console.log(`called equivalent: built-in ${report.equivalent.builtin}, math-verify ${report.equivalent.mathVerify}`);
for (const [category, c] of Object.entries(report.byCategory)) console.log(`  ${category.padEnd(10)} ${c.agree}/${c.total} (${pct(c.agree, c.total)})`);
if (report.disagreements.length > 0) console.log('\ndisagreements (gold | pred → built-in [rule] vs math-verify; what math-verify parsed):');
for (const d of report.disagreements) {
  console.log(`  ${d.pair.gold} | ${d.pair.pred} → ${d.builtin} [${d.builtinRule}] vs ${d.mathVerify}; ${JSON.stringify(d.parsed.gold)} ~ ${JSON.stringify(d.parsed.pred)}`);
}
