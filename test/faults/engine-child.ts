import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const script = fileURLToPath(new URL('./engine-process.ts', import.meta.url));

/** A fake vLLM engine (test double) running in a child process, so a test can kill it as an OS would. */
export interface EngineChild {
  url: string;
  model: string;
  process: ChildProcess;
  /** SIGKILL: no close handshake, sockets reset by the kernel; resolves once the process is gone. */
  kill9(): Promise<void>;
}

export async function startEngineChild(tokenLatencyMs: number): Promise<EngineChild> {
  const child = spawn(process.execPath, ['--import', 'tsx', script, String(tokenLatencyMs)], { stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const lines = createInterface({ input: child.stdout! });
  const first = await new Promise<string>((resolve, reject) => {
    lines.once('line', resolve);
    child.once('exit', (code, signal) => reject(new Error(`engine child exited (${code ?? signal}) before listening`)));
  });
  lines.close();
  const { url, model } = JSON.parse(first) as { url: string; model: string };
  return {
    url,
    model,
    process: child,
    kill9: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
  };
}
