import { connect, connectionOptions, withConnectionFlags, withinConnectTimeout, type ConnectionFlags } from './connection.js';
import { status, type ServiceError } from '@grpc/grpc-js';
import { Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import { closeSync, constants as fsConstants, fstatSync, openSync, readFileSync } from 'node:fs';
import { Socket } from 'node:net';
import type { runBackendsAdd } from './backends.js';
import { MAX_TIMER_MS } from '../timers.js';
import { DEFAULT_RETRIES, DEFAULT_RETRY_REFUSED_FOR_S } from './submit-defaults.js';
import { RolloutError } from '../errors.js';
import { forTerminal } from './terminal-text.js';
import { exitCleanlyAfterHangup } from './hung-up-terminal.js';

const int = (value: string): number => {
  const n = Number(value);
  if (!Number.isInteger(n)) throw new InvalidArgumentError(`not an integer: ${value}`);
  return n;
};
const collect = (value: string, previous: string[] = []): string[] => [...previous, value];
/** An integer in [min, max]: a demo of 0 groups, or of -1 samples a group, is a mistake to name, not a run to start. */
const intIn =
  (min: number, max: number) =>
  (value: string): number => {
    const n = int(value);
    if (n < min || n > max) throw new InvalidArgumentError(`must be between ${min} and ${max}, not ${value}`);
    return n;
  };

const program = new Command()
  .name('rollout')
  .description('Multi-turn LLM agent rollouts for RL training, as a gRPC service')
  .version('0.1.0')
  // Usage mistakes (an unknown flag, a value that is not an integer, a missing argument) are thrown as CommanderError,
  // not exited on with commander's own code 1: they are mistakes in what was asked, exit 2 (see the catch below).
  // Subcommands inherit both settings (they are created after them).
  .exitOverride()
  .configureOutput({ outputError: () => undefined });

program
  .command('serve')
  .description('run the rollout server')
  .option('--config <file>', 'JSON config file, or a pipe: <(jq ...), /dev/stdin (flags override it)')
  .option('--host <host>', 'address to bind (default 127.0.0.1)')
  .option('--port <port>', 'port, 0 = any free port (default 50051)', int)
  .option('--backend <url>', 'vLLM engine base URL (repeatable)', collect, [])
  .option('--model <name>', 'model name sent to engines')
  .option('--model-dir <dir>', "Hugging Face model folder: tokenizer.json, tokenizer_config.json, chat_template.jinja (default: the bundled Qwen3)")
  .option('--init-concurrency <n>', 'init stage workers', int)
  .option('--run-concurrency <n>', 'run stage workers (concurrent agent loops)', int)
  .option('--eval-concurrency <n>', 'eval stage workers', int)
  .option('--init-timeout-ms <ms>', 'default init stage timeout per sample', int)
  .option('--run-timeout-ms <ms>', 'default run stage timeout per sample', int)
  .option('--eval-timeout-ms <ms>', 'default eval stage timeout per sample', int)
  .option('--max-admitted <n>', 'samples admitted before request streams are paused', int)
  .option('--admin-token <token>', 'require this bearer token on BackendService and AdminService (or ROLLOUT_ADMIN_TOKEN; prefer --admin-token-file: a literal shows in process listings)')
  .option('--admin-token-file <file>', 'read the admin bearer token (BackendService, AdminService) from this file')
  .option('--token-file <file>', 'require the bearer token in this file on RolloutService (or ROLLOUT_TOKEN, or auth.token in the config)')
  .option('--tls-cert <file>', 'serve TLS with this PEM certificate chain (with --tls-key)')
  .option('--tls-key <file>', "the TLS certificate's PEM private key")
  .option('--tls-client-ca <file>', 'verify client certificates against this PEM CA')
  .option('--tls-require-client-cert', 'refuse clients without a certificate signed by --tls-client-ca (mTLS)')
  .option('--drain-grace-ms <ms>', 'on SIGTERM/SIGINT/SIGHUP or a Drain call: how long work in flight may finish before it is cancelled (default 30000)', int)
  .addOption(new Option('--sandbox-driver <driver>', 'sandbox driver (default bwrap)').choices(['bwrap', 'apptainer']))
  .option('--apptainer-path <binary>', "the apptainer driver's binary: apptainer, singularity or a path")
  .addOption(new Option('--math-checker <checker>', "the math environment's default answer checker (an instance may name its own)").choices(['builtin', 'math-verify']))
  .option('--journal-dir <dir>', 'durable journal (LMDB) of accepted tasks, finished trajectories and acks: a restart resumes from it')
  .option('--metrics-port <port>', 'serve Prometheus metrics on http://<metrics host>:<port>/metrics, 0 = any free port (default: off)', int)
  .option('--metrics-host <host>', 'address the metrics endpoint binds (default 127.0.0.1)')
  .option('--fake-engine', 'also start the fake vLLM engine (a test double) and route to it')
  .option('--fake-latency-ms <ms>', 'fake engine per-token latency', intIn(0, MAX_TIMER_MS), 1)
  .action(async (opts) => {
    const { runServe } = await import('./serve.js');
    await runServe({ ...opts, file: opts.config ? await readConfigFile(opts.config as string) : {} });
  });

program
  .command('demo')
  .description('server + fake vLLM engine + bubblewrap sandboxes + a client streaming GRPO groups of math trajectories')
  .option('--groups <n>', 'GRPO groups (tasks)', intIn(1, 100_000), 6)
  // At most the server's default maxNumSamples (the demo's server uses the defaults).
  .option('--group-size <n>', 'samples per group', intIn(1, 256), 4)
  .option('--latency-ms <ms>', 'fake engine per-token latency', intIn(0, MAX_TIMER_MS), 2)
  .option('--seed <n>', 'seed for problems and sampling', int, 7)
  .option('--messages', 'print the decoded transcript of the first trajectory')
  .option('--image <path>', 'sandbox image (.sif or directory); default the image scripts/setup.sh built')
  .addOption(new Option('--engine <engine>', 'fake vLLM engine, or llama.cpp in-process on a tiny random-weight Qwen3').choices(['fake', 'embedded']).default('fake'))
  .action(async (opts) => {
    const { runDemo } = await import('./demo.js');
    process.exitCode = await runDemo(opts);
  });

withConnectionFlags(program
  .command('submit')
  .description('run every row of a dataset (JSONL, or Parquet in verl\'s layout) on a server, writing trajectories as they arrive; resumable')
  .requiredOption('--dataset <file>', 'JSONL or .parquet dataset')
  .requiredOption('--environment <name>', 'environment to run each row in (e.g. math)')
  .option('--num-samples <n>', 'samples per row (GRPO group size)', int, 1)
  .option('--server <host:port>', 'server address', '127.0.0.1:50051')
  .option('--output <file>', 'trajectories as .jsonl or .parquet (default <dataset>.trajectories.jsonl)')
  .option('--instance-field <name>', 'take the instance from this field of each row (an object or a JSON string)')
  .option('--concurrency <n>', 'rows in flight at once', int, 64)
  .option('--retries <n>', "new attempts (new task ids, whole groups) for a row whose group had an infrastructure failure; 0 disables", int, DEFAULT_RETRIES)
  .option('--retry-refused-for <seconds>', 'how long a task the server refuses for now (starting, draining, busy, delivery paused) is submitted again, with backoff', Number, DEFAULT_RETRY_REFUSED_FOR_S)
  .option('--temperature <t>', 'sampling temperature', Number)
  .option('--max-tokens-per-turn <n>', 'sampling budget per turn', int)
  .option('--max-total-tokens <n>', 'sampling budget per trajectory', int))
  .action(async (opts) => {
    const { runSubmit } = await import('./submit.js');
    process.exitCode = await runSubmit(opts);
  });

withConnectionFlags(program
  .command('envs')
  .description('list the environments a server offers')
  .option('--address <host:port>', 'server address', '127.0.0.1:50051'))
  .action(async (opts: { address: string } & ConnectionFlags) => {
    const client = connect(opts.address, '--address', connectionOptions(opts));
    try {
      const { environments } = await withinConnectTimeout(client.rollout, opts.address, opts, client.listEnvironments());
      for (const e of environments) console.log(forTerminal(`${e.name}\t${e.description}\ttools: ${e.tools.join(', ')}`));
    } finally {
      client.close();
    }
  });

const backends = program.command('backends').description("a server's engines (BackendService)");
withConnectionFlags(backends
  .command('list', { isDefault: true })
  .description('list them: health, capacity and where it came from, logprobs mode, context length, load')
  .option('--address <host:port>', 'server address', '127.0.0.1:50051')
  .option('--admin-token <token>', 'BackendService bearer token (or ROLLOUT_ADMIN_TOKEN; prefer --admin-token-file)'), { admin: true })
  .action(async (opts: { address: string; adminToken?: string }) => {
    const { runBackendsList } = await import('./backends.js');
    await runBackendsList(opts);
  });
withConnectionFlags(backends
  .command('add <url>')
  .description('add an engine; prints what the server learned about it (capacity, logprobs mode, context length)')
  .option('--address <host:port>', 'server address', '127.0.0.1:50051')
  .option('--admin-token <token>', 'BackendService bearer token (or ROLLOUT_ADMIN_TOKEN; prefer --admin-token-file)'), { admin: true })
  .addOption(new Option('--kind <kind>', 'engine kind').choices(['vllm', 'sglang']).default('vllm'))
  .option('--id <id>', 'backend id (default: the url)')
  .option('--model <name>', "model name sent to the engine (default: the server's)")
  .option('--max-concurrency <n>', "requests it runs at once (default: what the engine reports, else the server's default)", int)
  .addOption(new Option('--logprobs-mode <mode>', 'the logprobs the engine reports, when it does not say itself').choices(['raw', 'processed']))
  .action(async (url: string, opts: Parameters<typeof runBackendsAdd>[1]) => {
    const { runBackendsAdd } = await import('./backends.js');
    await runBackendsAdd(url, opts);
  });

const image = program.command('image').description('sandbox images (Singularity .sif)');
image
  .command('build')
  .description('build a .sif from Debian packages (debootstrap minbase → squashfs → SIF; needs root), cached by content hash')
  .option('--packages <list>', 'comma-separated Debian packages (default: python3,bash,coreutils)')
  .option('--suite <suite>', 'Debian suite (default: bookworm)')
  .option('--cache-dir <dir>', 'image cache (default: .cache/images in the project)')
  .option('--mirror <url>', 'Debian mirror (default: http://deb.debian.org/debian)')
  .option('--out <path>', 'also copy the image to this path')
  .action(async (opts) => {
    const { runImageBuild } = await import('./image.js');
    process.exitCode = await runImageBuild(opts);
  });

const swe = program.command('swe').description('the SWE environment');
swe
  .command('build')
  .description('build the images of the SWE tasks in tasks/swe (PyPI sdists, fix reverted, on a Debian base .sif), cached by content hash')
  .option('--task <id>', 'a task to build (repeatable; default: all)', collect, [])
  .option('--cache-dir <dir>', 'sdists and task images (default: .cache/swe in the project)')
  .action(async (opts) => {
    const { runSweBuild } = await import('./swe.js');
    process.exitCode = await runSweBuild(opts);
  });

/** The largest config file read: a config is a few KiB; a larger file is a wrong path (a dataset, a log). */
const MAX_CONFIG_FILE_BYTES = 16 << 20;
/** How long a pipe's writer (`--config <(jq ...)`, `--config /dev/stdin`, a FIFO) has to write the config and close. */
const CONFIG_PIPE_DEADLINE_MS = 30_000;

/** A JSON config file, or a RolloutError naming the file and what is wrong with it. */
async function readConfigFile(path: string): Promise<Record<string, unknown>> {
  const text = await readConfigText(path);
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new RolloutError('invalid_argument', `config file ${path} is not JSON: ${(err as Error).message}`);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new RolloutError('invalid_argument', `config file ${path} must hold a JSON object`);
  return parsed as Record<string, unknown>;
}

/**
 * The config's text: a regular file read at once; a pipe (process substitution, /dev/stdin, a FIFO) read as its writer
 * writes, until the writer closes it, within MAX_CONFIG_FILE_BYTES and CONFIG_PIPE_DEADLINE_MS.
 *
 * Opened non-blocking: a plain open of a FIFO blocks until something writes to it, inside a call no signal can
 * interrupt (`serve` hung, even SIGTERM ignored). A pipe is then read on the event loop, never in a blocking call, so a
 * signal ends the process as usual. (A FIFO opened for reading without a writer yet does not read as ended: Linux
 * reports no hang-up on it until a writer has come, so the read waits for the writer, and a writer already waiting in
 * its open is let through.) Directories, devices and sockets are refused: /dev/zero would be read without end.
 */
async function readConfigText(path: string): Promise<string> {
  let fd: number | undefined;
  try {
    fd = openSync(path, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK);
    const stat = fstatSync(fd);
    if (stat.isFIFO()) {
      const pipe = fd;
      fd = undefined; // the socket owns it now
      return await readPipe(path, pipe);
    }
    if (!stat.isFile()) throw new RolloutError('invalid_argument', `config file ${path} is not a regular file (${stat.isDirectory() ? 'a directory' : 'a socket or device'})`);
    if (stat.size > MAX_CONFIG_FILE_BYTES) throw new RolloutError('invalid_argument', `config file ${path} is ${stat.size} bytes, more than a config's ${MAX_CONFIG_FILE_BYTES}: is it the right file?`);
    return readFileSync(fd, 'utf8');
  } catch (err) {
    if (err instanceof RolloutError) throw err;
    // Linux cannot open a socket by path (/dev/stdin of a process whose parent gave it a socket pair, as node does).
    if ((err as NodeJS.ErrnoException).code === 'ENXIO') throw new RolloutError('invalid_argument', `config file ${path} is a socket, which cannot be opened by its path: pass the config in a file or a pipe`);
    throw new RolloutError('invalid_argument', `cannot read config file ${path}: ${(err as Error).message}`);
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/** Everything written to the pipe `fd` until its writer closes it; the fd is closed either way. */
function readPipe(path: string, fd: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = new Socket({ fd, readable: true, writable: false });
    const chunks: Buffer[] = [];
    let bytes = 0;
    const fail = (message: string): void => {
      clearTimeout(timer);
      socket.destroy();
      reject(new RolloutError('invalid_argument', message));
    };
    // A FIFO nobody writes to (or a writer that never closes) fails naming the flag: never a wait for good.
    const timer = setTimeout(
      () => fail(`--config ${path}: the pipe was not written and closed within ${CONFIG_PIPE_DEADLINE_MS / 1000} s (${bytes} bytes so far): is anything writing to it?`),
      CONFIG_PIPE_DEADLINE_MS,
    );
    socket.on('data', (chunk: Buffer) => {
      bytes += chunk.length;
      if (bytes > MAX_CONFIG_FILE_BYTES) return fail(`config file ${path} is more than a config's ${MAX_CONFIG_FILE_BYTES} bytes: is it the right file?`);
      chunks.push(chunk);
    });
    socket.once('error', (err) => fail(`cannot read config file ${path}: ${err.message}`));
    socket.once('end', () => {
      clearTimeout(timer);
      socket.destroy();
      resolve(Buffer.concat(chunks).toString('utf8'));
    });
  });
}

exitCleanlyAfterHangup();
try {
  await program.parseAsync(process.argv);
} catch (err) {
  // A configuration or usage mistake, a server's refusal or a start-up failure the operator can fix (the port in use,
  // Apptainer missing, a journal directory that is a file) is one line for a person, not a stack trace: exit 2 for
  // a mistake in what was asked, 1 otherwise. An `internal` error or anything else thrown is a bug: its stack is kept.
  if (err instanceof CommanderError) {
    // --help and --version end here too (exit 0, their text already printed); so does a command given without its
    // subcommand (commander printed the help). Anything else is a usage mistake: one line, exit 2.
    if (err.exitCode !== 0 && err.code !== 'commander.help') console.error(forTerminal(`rollout: ${usageLine(err.message)}`));
    process.exitCode = err.exitCode === 0 ? 0 : 2;
  } else if (isServiceError(err)) {
    // What a server answers, and an error quoting what a tool, an engine or a file said, is shown, never obeyed.
    console.error(forTerminal(`rollout: the server answered ${status[err.code]}: ${err.details}`));
    process.exitCode = 1;
  } else {
    if (!(err instanceof RolloutError) || err.code === 'internal') throw err;
    console.error(forTerminal(`rollout: ${err.message}`));
    process.exitCode = err.code === 'invalid_argument' || err.code === 'failed_precondition' ? 2 : 1;
  }
}

/** Commander's message on one line, without its "error: " prefix ("unknown option '--prot' (Did you mean --port?)"). */
function usageLine(message: string): string {
  return message
    .replace(/^error: /, '')
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '')
    .join(' ');
}

function isServiceError(err: unknown): err is ServiceError {
  return err instanceof Error && typeof (err as Partial<ServiceError>).code === 'number' && typeof (err as Partial<ServiceError>).details === 'string';
}
