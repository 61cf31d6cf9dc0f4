import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/**
 * The Python runtimes the generated stubs (gen/python) are tested on, each a venv ./scripts/setup.sh fills from its
 * requirements file. Listed here, not discovered, with the versions each must really hold: a venv that silently
 * got another protobuf (a loosened pin, a shared venv) fails runtimes.test.ts instead of shrinking the matrix.
 */
export interface PythonRuntime {
  name: string;
  /** Venv directory, relative to the repo root. */
  venv: string;
  requirements: string;
  protobuf: RegExp;
  grpcio: RegExp;
}

export const PYTHON_RUNTIMES: readonly PythonRuntime[] = [
  { name: 'protobuf 7 (the client venv)', venv: '.venv', requirements: 'python/requirements.txt', protobuf: /^7\./, grpcio: /^1\.8\d\./ },
  { name: 'protobuf 6.33', venv: '.venvs/protobuf-6.33', requirements: 'python/compat/protobuf-6.33.txt', protobuf: /^6\.33\./, grpcio: /^1\.7\d\./ },
  { name: 'protobuf 5.29', venv: '.venvs/protobuf-5.29', requirements: 'python/compat/protobuf-5.29.txt', protobuf: /^5\.29\./, grpcio: /^1\.6\d\./ },
  { name: 'protobuf 3.20', venv: '.venvs/protobuf-3.20', requirements: 'python/compat/protobuf-3.20.txt', protobuf: /^3\.20\./, grpcio: /^1\.51\./ },
];

export interface PythonRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the runtime's python with `args` from the repo root. */
export function runPython(runtime: PythonRuntime, args: readonly string[]): Promise<PythonRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(`${ROOT}${runtime.venv}/bin/python`, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}
