import { execFile } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, rmSync, statSync, writeSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects } from 'hyparquet';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../../', import.meta.url));
const run = promisify(execFile);

describe('Parquet output of rollout submit', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'rollout-parquet-out-'));
  });
  afterAll(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('is written from a journal several times larger than the heap: the journal is streamed, a row group at a time', async () => {
    const output = join(dir, 'big.parquet');
    const journal = `${output}.partial.jsonl`;
    // 1,600 trajectories of 4,096 response tokens: ~110 MB of JSON lines, under a 64 MB old-generation heap.
    const rows = 1600;
    const tokens = 4096;
    const ids = Array.from({ length: tokens }, (_, i) => 1000 + ((i * 7919) % 150000));
    const body = JSON.stringify({
      groupId: 'g',
      environment: 'math',
      status: 'TRAJECTORY_STATUS_COMPLETED',
      promptTokenIds: ids.slice(0, 256),
      responseTokenIds: ids,
      responseMask: ids.map(() => 1),
      responseLogprobs: ids.map((id) => -(id % 1000) / 997),
      reward: 1,
      metadata: { row_index: '0' },
    }).slice(1);
    const fd = openSync(journal, 'w');
    for (let i = 0; i < rows; i++) writeSync(fd, `{"taskId":"t-${i}","sampleIndex":${i % 2},${body}\n`);
    closeSync(fd);
    expect(statSync(journal).size).toBeGreaterThan(100 << 20);
    const journalMb = (statSync(journal).size / 2 ** 20).toFixed(0);

    const { stdout } = await run(process.execPath, ['--max-old-space-size=64', '--import', 'tsx', 'test/support/parquet-output-child.ts', output], { cwd: root, maxBuffer: 1 << 20 });
    const measured = JSON.parse(stdout) as { maxRssKb: number; written: number };
    console.log(`Parquet output (${(statSync(output).size / 2 ** 20).toFixed(0)} MB) from a ${journalMb} MB journal of ${rows} rows: peak RSS ${(measured.maxRssKb / 1024).toFixed(0)} MB`);
    expect(measured.written).toBe(rows);
    expect(existsSync(journal)).toBe(false);

    const file = await asyncBufferFromFile(output);
    const metadata = await parquetMetadataAsync(file);
    expect(Number(metadata.num_rows)).toBe(rows);
    expect(metadata.row_groups.length).toBeGreaterThan(1);
    const [last] = await parquetReadObjects({ file, rowStart: rows - 1, rowEnd: rows });
    expect(last).toMatchObject({ task_id: `t-${rows - 1}`, sample_index: 1, status: 'TRAJECTORY_STATUS_COMPLETED', reward: 1 });
    expect(last!.response_token_ids).toEqual(ids);
  }, 180_000);
});
