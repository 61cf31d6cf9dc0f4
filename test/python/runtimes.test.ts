import { readdir } from 'node:fs/promises';
import { describe, expect, it } from 'vitest';
import { PYTHON_RUNTIMES, ROOT, runPython } from './runtimes.js';

const VERSIONS = 'import json, google.protobuf, grpc; print(json.dumps({"protobuf": google.protobuf.__version__, "grpcio": grpc.__version__}))';

describe('the Python runtime matrix', () => {
  it.each(PYTHON_RUNTIMES)('$venv really holds $name with a grpcio of its era', async (runtime) => {
    const { code, stdout, stderr } = await runPython(runtime, ['-c', VERSIONS]);
    expect(code, `${runtime.venv}: ${stderr} (run ./scripts/setup.sh)`).toBe(0);
    const versions = JSON.parse(stdout) as { protobuf: string; grpcio: string };
    expect(versions.protobuf).toMatch(runtime.protobuf);
    expect(versions.grpcio).toMatch(runtime.grpcio);
  });

  it('has one leg per python/compat requirements file, each on a protobuf of its own', async () => {
    const compat = (await readdir(`${ROOT}python/compat`)).filter((f) => f.endsWith('.txt')).map((f) => `python/compat/${f}`);
    expect(PYTHON_RUNTIMES.map((r) => r.requirements).sort()).toEqual(['python/requirements.txt', ...compat].sort());
    const majorMinor = new Set<string>();
    for (const runtime of PYTHON_RUNTIMES) {
      const { stdout } = await runPython(runtime, ['-c', 'import google.protobuf; print(google.protobuf.__version__)']);
      majorMinor.add(stdout.trim().split('.').slice(0, 2).join('.'));
    }
    expect(majorMinor.size).toBe(PYTHON_RUNTIMES.length);
    expect(PYTHON_RUNTIMES.length).toBeGreaterThanOrEqual(3);
  });
});
