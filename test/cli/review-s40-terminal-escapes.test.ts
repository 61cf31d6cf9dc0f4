import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { forTerminal, forTerminalLine } from '../../src/cli/terminal-text.js';
import { spawnServe } from '../support/rollout-process.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

/** A control byte but newline and tab (ESC, BEL, CR, C1 as UTF-8 code points). */
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g;

/** Runs `cmd` in the project, returning its exit code and stdout/stderr as raw bytes. */
function run(args: string[]): Promise<{ code: number | null; out: Buffer }> {
  const child = spawn(process.execPath, args, { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' } });
  const chunks: Buffer[] = [];
  child.stdout.on('data', (d: Buffer) => chunks.push(d));
  child.stderr.on('data', (d: Buffer) => chunks.push(d));
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, out: Buffer.concat(chunks) })));
}

/** The non-JSON lines (what the demo prints for people; the JSON logs are machine output, escaped by JSON). */
function personLines(out: Buffer): string {
  return out
    .toString('utf8')
    .split('\n')
    .filter((l) => !l.startsWith('{'))
    .join('\n');
}

describe('text from the model and the tools is shown, never obeyed, by the terminal', () => {
  it('forTerminal escapes C0 (but newline and tab), DEL, C1 and bidi controls; leaves the rest as it is', () => {
    expect(forTerminal('a\u001b]52;c;eA==\u0007b\n\tc\rd\u007f\u009b\u202e\u2066 é 漢 \\n')).toBe(String.raw`a\x1b]52;c;eA==\x07b` + '\n\t' + String.raw`c\x0dd\x7f\x9b\u202e\u2066 é 漢 \n`);
  });

  it('forTerminalLine (a table cell, a progress line) escapes line breaks and tabs too', () => {
    expect(forTerminalLine('a\u001b[2Jb\n\tc')).toBe(String.raw`a\x1b[2Jb\n\tc`);
  });

  // Regression: the transcript was printed raw: the tool's OSC 52 wrote the operator's clipboard, \x1b[2J cleared the
  // screen, OSC 0 retitled the window, OSC 8 hid a link.
  it('`rollout demo --messages` with a policy and a real sandboxed tool writing escape sequences prints them escaped', async () => {
    const { code, out } = await run(['--import', 'tsx', 'test/cli/review-s40-hostile-demo.ts']);
    const text = personLines(out);
    expect(code, text).toBe(0);
    // No control byte but newline and tab reaches the terminal: no ESC, BEL, CR, no 8-bit CSI (U+009B in UTF-8).
    expect(text.match(CONTROL) ?? []).toEqual([]);
    // The policy's own text, escaped.
    expect(text).toContain(String.raw`assistant: Let me look.\x1b]52;c;cG9saWN5\x07\x1b[2J`);
    expect(text).toContain(String.raw`assistant: The answer is \boxed{0}.\x1b]0;policy-title\x07`);
    // The bash tool's output (the raw bytes printf wrote in the sandbox), escaped.
    expect(text).toContain(String.raw`tool: \x1b]52;c;b3duZWQ=\x07\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil.example/\x1b\link\x1b]8;;\x1b\ \x0dFAKE \x9b done`);
  }, 120_000);

  // Regression: `rollout submit` printed a server's refusal (which quotes what it was sent) raw.
  it('`rollout submit` prints what the server answers escaped', async () => {
    const serve = await spawnServe(['--fake-engine']);
    const dir = mkdtempSync(join(tmpdir(), 'review-s40-escapes-'));
    try {
      const dataset = join(dir, 'rows.jsonl');
      writeFileSync(dataset, JSON.stringify({ problem: 'What is 1 + 1?', answer: '2' }) + '\n');
      const { code, out } = await run(['bin/rollout.js', 'submit', '--server', serve.address, '--dataset', dataset, '--environment', 'nope\u001b]52;c;eA==\u0007\u001b[2J']);
      const text = out.toString('utf8');
      expect(code, text).toBe(1); // a rejected row
      expect(text.match(CONTROL) ?? []).toEqual([]);
      expect(text).toContain(String.raw`rejected: environment: unknown environment "nope\x1b]52;c;eA==\x07\x1b[2J"`);
    } finally {
      serve.kill();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);

  // Regression: the CLI's one-line error (`rollout: ...`, a server's or gRPC's message quoting its input) was raw.
  it("the CLI's error line is escaped", async () => {
    const { code, out } = await run(['bin/rollout.js', 'envs', '--address', '127.0.0.1:1\u001b]0;pwned\u0007']);
    const text = out.toString('utf8');
    expect(code, text).toBe(1);
    expect(text.match(CONTROL) ?? []).toEqual([]);
    expect(text).toContain(String.raw`127.0.0.1:1\x1b]0;pwned\x07`);
  }, 60_000);
});
