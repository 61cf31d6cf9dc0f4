import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

// The answer checker's and the token threads' pools say their threads are unref'ed, so a pool nobody closed keeps no
// process alive. It did not hold: Node 20 refs a worker's port again when a 'message' listener is added, and both
// pools unref'ed before adding theirs. Found through `serve --math-checker`, whose registry's checker pool nobody
// closed: the server stopped and the process stayed. Each case runs a real node process that uses a pool, never
// closes it, and must end on its own (killed after 60 s otherwise: then it reports no exit code) — but only after the
// work it awaits: an unref'ed thread alone does not keep a process alive, so a pool unref'ed while a task runs lets a
// script end before its answer (exit code 13, a top-level await never settled). Threads are held while work is pending.
const CHILD = fileURLToPath(new URL('./review-s39-unclosed-pools-child.ts', import.meta.url));

function run(kind: 'check' | 'token'): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', CHILD, kind], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.once('error', reject);
    child.once('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

describe('pools of worker threads nobody closed', () => {
  it('the shared answer-checker pool lets its process end once its work is done', async () => {
    const r = await run('check');
    expect(r.stderr).toBe('');
    expect(JSON.parse(r.stdout)).toEqual({ result: { equivalent: true, method: 'symbolic' } });
    expect(r.code).toBe(0);
  }, 90_000);

  it('a token pool lets its process end once its work is done', async () => {
    const r = await run('token');
    expect(r.stderr).toBe('');
    expect(JSON.parse(r.stdout)).toBe('hi');
    expect(r.code).toBe(0);
  }, 90_000);
});
