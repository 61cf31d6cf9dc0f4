import type { DirEntry, ExecOptions, ExecResult, PersistentShell, Sandbox, SandboxProcess } from '../../src/sandboxes/types.js';
import { testSpec } from '../sandboxes/helpers.js';

/**
 * An in-memory Sandbox: files live in a Map, exec answers from a script (default: exit 0, no output).
 * It records every call so tests can assert what an environment did, or that it did nothing.
 */
export class FakeSandbox implements Sandbox {
  readonly id = 'fake-sandbox';
  readonly spec = testSpec();
  readonly workdir = '/work';
  readonly files = new Map<string, string>();
  readonly calls: string[] = [];
  stopped = false;

  constructor(private readonly onExec: (argv: readonly string[], options?: ExecOptions) => Partial<ExecResult> = () => ({})) {}

  async exec(argv: readonly string[], options?: ExecOptions): Promise<ExecResult> {
    this.calls.push(`exec ${argv.join(' ')}`);
    return { exitCode: 0, signal: null, stdout: '', stderr: '', timedOut: false, truncated: false, durationMs: 0, ...this.onExec(argv, options) };
  }

  spawn(): SandboxProcess {
    throw new Error('FakeSandbox spawns nothing');
  }

  shell(): PersistentShell {
    throw new Error('FakeSandbox has no shell');
  }

  async listDir(path: string): Promise<DirEntry[]> {
    this.calls.push(`list ${path}`);
    return [];
  }

  async writeFile(path: string, content: string): Promise<void> {
    this.calls.push(`write ${path}`);
    this.files.set(path, content);
  }

  async readFile(path: string): Promise<string> {
    this.calls.push(`read ${path}`);
    const content = this.files.get(path);
    if (content === undefined) throw new Error(`ENOENT: ${path}`);
    return content;
  }

  async stop(): Promise<void> {
    this.calls.push('stop');
    this.stopped = true;
  }
}
