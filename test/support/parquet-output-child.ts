// Child process of test/cli/submit-output.test.ts: turns a Parquet output's journal into the Parquet file under the
// heap limit the test gives node, then prints its peak resident memory (kB) for the test to report.
import { openTrajectoryOutput } from '../../src/cli/submit-output.js';

const output = await openTrajectoryOutput(process.argv[2]!);
await output.close(true);
process.stdout.write(`${JSON.stringify({ maxRssKb: process.resourceUsage().maxRSS, written: [...output.written.values()].reduce((n, s) => n + s.size, 0) })}\n`);
