import { z } from 'zod';
import { DEFAULT_BODY_IDLE_MS, withoutCredentials } from './backends/engine-http.js';
import { BACKEND_KIND_NAMES, backendKind } from './backends/kinds.js';
import { DEFAULT_MAX_RETRY_AFTER_MS, DEFAULT_STALL_MS } from './backends/pool-options.js';
import { DEFAULT_MAX_BUFFERED_RESPONSE_BYTES, MAX_BUFFERED_RESPONSE_BYTES, MIN_BUFFERED_RESPONSE_BYTES } from './backends/response-budget.js';
import { tokenProblem } from './bearer-token.js';
import { MAX_ACK_ENTRIES } from './contract/session.js';
import { RolloutError } from './errors.js';
import { isIpv4Cidr } from './sandboxes/slirp-network.js';
import { MAX_TIMER_MS } from './timers.js';

/**
 * Per-stage worker pool settings: concurrency and the default timeout of one sample in that stage. Each field has
 * its stage's own default, so `{ "init": { "concurrency": 8 } }` keeps init's default timeout.
 */
const stageSchema = (defaults: { concurrency: number; timeoutMs: number }) =>
  z
    .strictObject({
      concurrency: z.number().int().min(1).max(100_000).default(defaults.concurrency),
      timeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(defaults.timeoutMs),
    })
    .prefault({});

/** The tool-call formats the server can parse (src/tools/parsers.ts); a list, so zod and the parser factory agree. */
export const TOOL_CALL_PARSERS = ['hermes', 'llama3_json', 'deepseek_v3'] as const;
export type ToolCallParserName = (typeof TOOL_CALL_PARSERS)[number];

const modelObjectSchema = z.strictObject({
  /** Model name sent to engines. */
  name: z.string().default('policy'),
  /**
   * A Hugging Face model folder: tokenizer.json, tokenizer_config.json and optionally chat_template.jinja,
   * generation_config.json and config.json (its vocab_size). Unset: the Qwen3 tokenizer and template shipped with the project.
   */
  dir: z.string().min(1).optional(),
  /** Extra chat-template variables, e.g. `{ "enable_thinking": false }` for Qwen3. */
  templateVariables: z.record(z.string(), z.unknown()).default({}),
  /** How assistant text is parsed for tool calls; unset: detected from the template (see detectToolCallParser). */
  toolCallParser: z.enum(TOOL_CALL_PARSERS).optional(),
});

/** `model` is an object; a bare string is the engines' model name, as before (`"model": "qwen"` = `{ name: "qwen" }`). */
const modelSchema = z
  .preprocess((value) => (typeof value === 'string' ? { name: value } : value), modelObjectSchema)
  // The cast only names the types preprocess erases: a string or the object in, the object out, the key optional.
  .prefault({}) as unknown as z.ZodDefault<z.ZodType<z.output<typeof modelObjectSchema>, string | z.input<typeof modelObjectSchema>>>;

/** The `model` section after defaults. */
export type ModelConfig = z.output<typeof modelObjectSchema>;

/**
 * Bounds of what a backend may be declared with (config `backends`, AddBackend): ids, urls and model names are listed by
 * every ListBackends and Watch stats message, so an unbounded one could make those answers too large for anyone.
 */
export const MAX_BACKEND_ID_BYTES = 256;
export const MAX_BACKEND_URL_BYTES = 2048;
export const MAX_BACKEND_MODEL_BYTES = 1024;

/** Why `id` cannot name a backend, or undefined when it can: at most 256 bytes of UTF-8, no control characters. */
export function backendIdProblem(id: string): string | undefined {
  if (Buffer.byteLength(id) > MAX_BACKEND_ID_BYTES) return `at most ${MAX_BACKEND_ID_BYTES} bytes`;
  if (/\p{Cc}/u.test(id)) return 'must not contain control characters';
  return undefined;
}

const tokenSchema = z.string().superRefine((token, ctx) => {
  const problem = tokenProblem(token);
  if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
});

/** A string of at most `max` bytes of UTF-8. */
const stringOfMaxBytes = (max: number) => z.string().refine((s) => Buffer.byteLength(s) <= max, { message: `at most ${max} bytes` });

const backendSchema = z
  .strictObject({
    /**
     * The engine's base URL. Userinfo (`http://user:pass@host:8000`) is sent as HTTP basic auth and a query string
     * (`?api_key=...`) with every request; neither is shown: the backend's url (ListBackends, logs, errors) and its
     * default id are the URL without userinfo and with its query values masked (`?api_key=***`).
     */
    url: stringOfMaxBytes(MAX_BACKEND_URL_BYTES).pipe(z.string().url()),
    kind: z.enum(BACKEND_KIND_NAMES).default('vllm'),
    /** Requests the engine runs at once; 0 (default): what the engine reports, else `backendDefaultMaxConcurrency`. */
    maxConcurrency: z.number().int().min(0).default(0),
    /** Default: the url as shown (without its userinfo, query values masked). */
    id: z
      .string()
      .superRefine((id, ctx) => {
        const problem = backendIdProblem(id);
        if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
      })
      .optional(),
    model: stringOfMaxBytes(MAX_BACKEND_MODEL_BYTES).optional(),
    /**
     * The engine's logprobs mode when you know how it was started (`processed`: vLLM --logprobs-mode
     * processed_logprobs, SGLang without SGLANG_RETURN_ORIGINAL_LOGPROB; `raw`: vLLM's default). Unset: learned where
     * the engine says (vLLM in dev mode), else unknown. An engine that reports another mode stops the server.
     */
    logprobsMode: z.enum(['raw', 'processed']).optional(),
    /**
     * vLLM only: refuse (as an engine error: the request moves, nothing is recorded) a completion whose `id` is not
     * `cmpl-<X-Request-Id>` — what vLLM names an answer to a request sent with that header — so an answer meant for
     * another request is caught even when its prompt has the same length (`usage.prompt_tokens` is always checked).
     * Off by default: a gateway in front of vLLM may rename answers. SGLang's answers (`meta_info.id`) are always checked.
     */
    checkAnswerId: z.boolean().default(false),
  })
  // A URL its kind cannot reach (vllm/sglang over http(s); embedded file:/embedded:) is named here, not thrown later by
  // the client's constructor. The URL itself is not echoed: it may carry credentials.
  .superRefine((backend, ctx) => {
    const problem = backendKind(backend.kind).urlProblem(backend.url);
    if (problem !== undefined) ctx.addIssue({ code: 'custom', path: ['url'], message: problem });
    if (backend.checkAnswerId && backend.kind !== 'vllm') {
      ctx.addIssue({ code: 'custom', path: ['checkAnswerId'], message: `is for vllm backends (${backend.kind === 'sglang' ? "an sglang engine's answers are always checked" : "an embedded engine's answers come in process"})` });
    }
  })
  // The default id is set here, not where the backend is added, so that it never carries the URL's credentials.
  .transform((backend) => ({ ...backend, id: backend.id ?? withoutCredentials(backend.url) }));

/** Backends are told apart by id (ListBackends, RemoveBackend, routing): two with one id are a mistake, named at the second. */
const backendsSchema = z.array(backendSchema).superRefine((backends, ctx) => {
  const first = new Map<string, number>();
  backends.forEach((backend, i) => {
    const earlier = first.get(backend.id);
    if (earlier === undefined) first.set(backend.id, i);
    else ctx.addIssue({ code: 'custom', path: [i, 'id'], message: `the same id as backends[${earlier}] (${JSON.stringify(backend.id)}; the url's unless set): give each backend its own` });
  });
});

/**
 * Server configuration, validated once at start-up with zod so a typo fails loudly instead of running with a
 * silent default: objects are strict at every depth (an unknown or misspelt key is an error naming it), and every
 * field has its own default, so a partial object keeps the defaults of what it leaves out.
 */
export const serverConfigSchema = z.strictObject({
  host: z.string().default('127.0.0.1'),
  port: z.number().int().min(0).max(65_535).default(50_051),
  /** The policy model: its name at the engines, its folder (tokenizer, template), template variables, tool-call parser. */
  model: modelSchema,
  init: stageSchema({ concurrency: 64, timeoutMs: 60_000 }),
  run: z
    .strictObject({
      ...stageSchema({ concurrency: 1024, timeoutMs: 600_000 }).unwrap().shape,
      /**
       * Share of a task's run timeout that the model's tool calls may take in total: the episode's tool-time budget. A
       * policy that uses it up (a `sleep`, an endless loop) ends TRUNCATED (finish_reason `tool_time_budget`) and is
       * evaluated. Whatever the share, a tool call still running near the run stage's deadline is cut before it, with the
       * same outcome; only the engine's stalls stay TIMEOUT. README, Statuses.
       */
      toolTimeShare: z.number().gt(0).max(0.9).default(0.9),
    })
    .prefault({}),
  eval: stageSchema({ concurrency: 64, timeoutMs: 60_000 }),
  /** Samples admitted (queued + in flight) before the server stops reading request streams. */
  maxAdmitted: z.number().int().min(1).default(20_000),
  maxNumSamples: z.number().int().min(1).default(256),
  /** Serialized size limit of TaskSpec.instance, bytes. */
  maxInstanceBytes: z.number().int().min(1).default(1 << 20),
  /** gRPC message size limit, bytes. */
  maxMessageBytes: z.number().int().min(1024).default(64 << 20),
  defaults: z
    .strictObject({
      maxTurns: z.number().int().min(1).default(8),
      maxTokensPerTurn: z.number().int().min(1).default(1024),
      maxTotalTokens: z.number().int().min(1).default(16_384),
      totalTimeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(900_000),
    })
    .prefault({}),
  sandbox: z
    .strictObject({
      /** Which driver runs sandboxes: bubblewrap (rootless; runs .sif images itself) or Apptainer/Singularity. */
      driver: z.enum(['bwrap', 'apptainer']).default('bwrap'),
      /** The Apptainer driver's binary: `apptainer`, `singularity` (SingularityCE takes the same flags) or a path. */
      apptainerPath: z.string().min(1).default('apptainer'),
      /**
       * How the Apptainer driver holds diskMb: `overlay` (each sandbox writes into an EXT3 overlay image of diskMb:
       * a quota of the whole sandbox), `none` (host-dir workspace, no quota), `auto` (overlay, or none with a warning
       * where apptainer cannot use overlay images). See ApptainerDriverOptions.disk.
       */
      apptainerDisk: z.enum(['auto', 'overlay', 'none']).default('auto'),
      /**
       * What a sandbox asking for network (`network: true`) gets from the bubblewrap driver. `isolated`: its own network
       * namespace NAT'ed out by slirp4netns (scripts/setup.sh installs it; without it such a sample ends SANDBOX_ERROR),
       * the host's 127.0.0.1 and abstract UNIX sockets out of reach. `host`: the host's own network namespace — the
       * sandbox reaches every service on the host's loopback (engines' unauthenticated /pause, this server's port),
       * its abstract sockets and all it can reach; only for code you would run on the host itself. README, Sandboxes.
       * The Apptainer driver ignores it (network there is always the host's namespace).
       */
      networkMode: z.enum(['isolated', 'host']).default('isolated'),
      /**
       * IPv4 CIDRs an `isolated` sandbox may reach although they are private: by default the RFC 1918 ranges, link-local
       * (cloud metadata 169.254.169.254), CGNAT, multicast and the host's own addresses are refused inside the sandbox
       * (PRIVATE_DESTINATIONS, src/sandboxes/slirp-network.ts). E.g. `["10.1.0.0/16"]` for a package mirror on the LAN.
       */
      networkAllow: z.array(z.string().refine(isIpv4Cidr, { error: 'must be an IPv4 CIDR such as 10.1.0.0/16' })).default([]),
      /** Default root file system when an environment names none: a .sif, a directory, or unset for the host's /usr. */
      image: z.string().optional(),
      /**
       * Directories (absolute) under which an image an environment asks for (e.g. a SWE task's `instance.image`) must
       * lie, symlinks resolved; "host" and anything else are refused, so a task cannot run its sandbox over the
       * server's own files. Default: where `rollout image build` and `rollout swe build` put images
       * (`<project>/.cache/images`, `<project>/.cache/swe/images`) and the directory holding `image`. The configured
       * `image` itself is always allowed. See `allowedImageDirs` in src/sandboxes/spec.ts.
       */
      imageDirs: z.array(z.string().startsWith('/', { error: 'must be an absolute path' })).optional(),
      /** Memory of a whole sandbox (processes + tmpfs workspace and /tmp), MiB. */
      memoryMb: z.number().int().min(16).default(1024),
      /**
       * The most memory one sandbox may be given when an instance needs more than `memoryMb` (e.g. a code task whose
       * `memory_limit_mb` is 2048), MiB; a task needing more is refused at submit. Default 4096 (src/sandboxes/spec.ts),
       * never less than `memoryMb`.
       */
      maxMemoryMb: z.number().int().min(16).optional(),
      /** Processes and threads of a whole sandbox. */
      maxProcesses: z.number().int().min(1).default(64),
      /** Size quota of the workspace and of /tmp, MiB (bubblewrap: each; Apptainer's overlay: the whole sandbox's writes). */
      diskMb: z.number().int().min(1).default(512),
      wallClockMs: z.number().int().min(1).max(MAX_TIMER_MS).default(900_000),
      /** Default timeout of one command, ms. */
      commandTimeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(60_000),
      outputLimitBytes: z.number().int().min(256).default(16_384),
      maxFileMb: z.number().int().min(1).default(256),
      /** Workspace path inside sandboxes. */
      workdir: z.string().startsWith('/').default('/work'),
    })
    .prefault({}),
  /**
   * Threads that render and tokenize long prompts and conversations, so the event loop serving gRPC and the engines
   * never blocks on them (src/tokens/token-pool.ts). They start with the first task too large for the event loop.
   */
  tokenWorkers: z
    .strictObject({
      /** Threads; 0 = none (all token work on the event loop). Default: one per core left to the event loop, 1 to 4. */
      count: z.number().int().min(0).max(64).optional(),
      /** Tasks that render and encode at most this many characters stay on the event loop (cheaper than a thread hop). */
      inlineMaxChars: z.number().int().min(0).default(2048),
      /** Tasks waiting for a thread beyond which more fail with RESOURCE_EXHAUSTED. */
      maxQueued: z.number().int().min(1).default(65_536),
      /**
       * A thread still on one task after this long is stopped and replaced (the task fails INTERNAL): a render stuck
       * in a pathological template must not hold a thread for good. 0 = no limit.
       */
      taskTimeoutMs: z.number().int().min(0).max(MAX_TIMER_MS).default(60_000),
      /** A thread still on a task its caller gave up (cancelled, timed out) this long after is stopped and replaced. */
      abandonedTaskGraceMs: z.number().int().min(0).max(MAX_TIMER_MS).default(1_000),
    })
    .prefault({}),
  /**
   * Lower the process's helper threads (V8's garbage-collector and compiler workers, libuv's pool) below the event
   * loop's priority when the server starts, as token threads lower their own, so on a busy machine the thread that
   * serves gRPC and the engines gets a core first (Linux only; src/thread-priority.ts). The pool also runs the
   * journal's commits and an embedded engine's evaluation, which then yield to normal-priority work on a machine
   * with no core to spare. Off: they keep the process's.
   */
  lowerHelperThreads: z.boolean().default(true),
  backends: backendsSchema.default([]),
  /** Capacity of a backend whose maxConcurrency is 0 and whose engine does not report one (or not yet). */
  backendDefaultMaxConcurrency: z.number().int().min(1).default(256),
  /** Budget of one engine request (one turn); past it the request fails with BACKEND_ERROR. 0 = none. */
  backendRequestTimeoutMs: z.number().int().min(0).max(MAX_TIMER_MS).default(300_000),
  /**
   * Once an engine's answer has sent its headers, the longest its body may then send nothing, ms (default 30 s): vLLM
   * and SGLang send a non-streaming answer's headers and body together, so a body silent this long is a hung engine or
   * proxy, not a long generation (which sends no headers until it is done, and only backendRequestTimeoutMs bounds).
   * Past it the engine counts as lost: its health is checked at once and the request moves (failover). A wait for
   * room in backendMaxBufferedResponseBytes does not count. At most backendRequestTimeoutMs when that is set (a
   * longer one would never fire: the request's budget ends first); the default is then simply outlasted by it.
   */
  backendBodyIdleTimeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(DEFAULT_BODY_IDLE_MS),
  /**
   * The longest Retry-After of an engine's busy answer (HTTP 429/503) that is honoured, ms (default 60 s): that engine
   * is asked again no sooner than its Retry-After, by every request to it, but never later than this after the answer
   * — an engine or gateway asking for an hour must not hold its trajectories that long.
   */
  backendMaxRetryAfterMs: z.number().int().min(1).max(MAX_TIMER_MS).default(DEFAULT_MAX_RETRY_AFTER_MS),
  /**
   * An engine whose requests have all gone unanswered this long, ms (default 60 s; 0 disables), while its work counters
   * (vLLM's and SGLang's Prometheus /metrics: tokens prefilled and generated) did not move either, is hung — though its
   * /health may answer 200: its requests move to other engines (failover) and it takes no trajectory until its counters
   * move or it recovers from being down. A long non-streamed generation sends nothing until it is done, but moves the
   * counters: it is left alone. Keep it above the longest prefill of one prompt (vLLM counts a prompt's tokens when its
   * prefill is done). An engine without such counters (no /metrics, SGLang without --enable-metrics) is not watched.
   */
  backendStallMs: z.number().int().min(0).max(MAX_TIMER_MS).default(DEFAULT_STALL_MS),
  /**
   * Largest engine answer (completion body) accepted, in bytes; a larger one fails its trajectory with
   * BACKEND_ERROR as soon as the cap is passed. 0 = derived per request from its prompt length and max_tokens
   * (64 KiB + 1 KiB per requested token + 16 bytes per prompt token).
   */
  backendMaxResponseBytes: z.number().int().min(0).default(0),
  /**
   * Bytes of engine answers buffered at once across all backends (1 MiB to 64 GiB; default 1 GiB). The per-answer cap
   * above bounds one answer; this bounds them together (1,024 concurrent answers of 16 MiB would be 16 GiB). An answer
   * without room waits, its reading paused, until answers being read end; one larger than the whole budget fails its
   * trajectory with BACKEND_ERROR at once.
   */
  backendMaxBufferedResponseBytes: z.number().int().min(MIN_BUFFERED_RESPONSE_BYTES).max(MAX_BUFFERED_RESPONSE_BYTES).default(DEFAULT_MAX_BUFFERED_RESPONSE_BYTES),
  /** Budget of asking an engine its limits (GET /v1/models → max_model_len) when it is added. */
  backendModelInfoTimeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(5_000),
  /** How long a trajectory waits for an eligible backend before failing with BACKEND_ERROR. */
  backendAcquireTimeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(30_000),
  /**
   * An engine that comes back after it was down, while the pool serves a policy version other than 0, is held until
   * the trainer's next ResumeGeneration (it may have restarted with the base checkpoint's weights: its tokens would be
   * recorded with a version it no longer serves). False: it serves again at once (a blip then costs nothing, a
   * restart mislabels its tokens until the next weight sync).
   */
  backendHoldRecovered: z.boolean().default(true),
  /** How often one request is asked again after its engine answered busy (HTTP 429/503), and the first wait (doubling, at most 8 s). */
  backendMaxBusyRetries: z.number().int().min(0).default(8),
  backendBusyBackoffMs: z.number().int().min(1).max(MAX_TIMER_MS).default(250),
  /**
   * How often one assistant turn is asked again for the rest after its request was aborted (PauseGeneration ABORT,
   * an engine's abort) before the sample fails with BACKEND_ERROR: an engine that aborts forever must not loop.
   */
  maxContinuationsPerTurn: z.number().int().min(0).default(8),
  /**
   * Tool calls of one assistant message that are run, in order; the rest are answered by one observation telling the
   * model to call them again. Why a bound: a degenerate completion of thousands of short calls would run thousands of
   * programs and carry their output into the context before the token budget can refuse it. At most 1024, past which
   * one message's observations alone outgrow any context.
   */
  maxToolCallsPerMessage: z.number().int().min(1).max(1024).default(16),
  /**
   * How often a sample past its task's max_staleness is run again from scratch (staleness_action RESTART) before it
   * is delivered with `stale` set.
   */
  maxStalenessRestarts: z.number().int().min(0).default(2),
  /** Finished tasks kept for GetTrajectory and re-submits before the oldest are dropped (they hold full token arrays). */
  retainFinishedTasks: z.number().int().min(0).default(2_000),
  /** ...and at most about this many bytes of their trajectories. */
  retainFinishedBytes: z.number().int().min(0).default(512 << 20),
  /**
   * Trainer sessions (src/contract/session.ts). Every bound is in bytes of encoded messages, because one trajectory
   * may be 1 KiB or 50 MiB: a count bounds nothing.
   */
  sessions: z
    .strictObject({
      /**
       * Encoded bytes of trajectories sent to one session and not yet acked, past which delivery to it pauses (the
       * client gets `delivery_paused`; finished trajectories are held for it and sent as acks come in). A single
       * trajectory larger than the bound is still sent when nothing else is unacked.
       */
      maxUnackedBytes: z.number().int().min(1).default(256 << 20),
      /**
       * Encoded bytes queued on one stream and not yet taken by the transport (a client that is not reading): past
       * it the server stops reading that stream's requests (gRPC flow control pushes back on its tasks) and drops
       * its stage events (advisory; Watch has them too). Trajectories queued there are also unacked, so they stay
       * within maxUnackedBytes; this bound holds everything else (accepted, rejected, stage events).
       */
      maxOutboxBytes: z.number().int().min(1024).default(4 << 20),
      /**
       * Encoded bytes (unacked + held) that all detached sessions (stream broken, resumable) may hold together: one
       * client opening session after session with fresh ids, filling each to maxUnackedBytes and abandoning it, would
       * otherwise hold that bound per session for ttlMs. Past it the longest-detached sessions are dropped as if
       * expired (a resume of one is NOT_FOUND).
       */
      maxDetachedBytes: z.number().int().min(1).default(1 << 30),
      /**
       * A Rollout stream whose client took no message for this long (its HTTP/2 window stayed shut: one write blocked
       * this long, ms) is ended with RESOURCE_EXHAUSTED naming this key; its session stays resumable for ttlMs with
       * every unacked trajectory. Until then such a stream holds its outbox, its trajectories as objects and an attached
       * session that no detached-session bound counts; after, only the session's wire bytes under maxDetachedBytes. 0 =
       * never. The timer covers one whole message (grpc-js shows no progress inside one): 10 min lets a 64 MiB
       * trajectory through a link of ~0.11 MiB/s; at 2 min a slower link would be ended on the same message every resume.
       */
      stalledMs: z.number().int().min(0).max(MAX_TIMER_MS).default(600_000),
      /**
       * Sessions the server holds at once, attached or detached (resumable), server-wide: RolloutService has no client
       * identity beyond its one token. Opening one more is RESOURCE_EXHAUSTED naming this key; resumes are not refused.
       */
      maxOpen: z.number().int().min(1).default(4096),
      /** How long a session whose stream broke stays resumable. */
      ttlMs: z.number().int().min(1).max(MAX_TIMER_MS).default(10 * 60_000),
      /**
       * The most task ids and trajectories one Ack may list (at most contract/session.ts MAX_ACK_ENTRIES, the
       * default): advertised to clients in the Rollout stream's `rollout-max-ack-entries` header; a larger ack is refused.
       */
      maxAckEntries: z.number().int().min(1).max(MAX_ACK_ENTRIES).default(MAX_ACK_ENTRIES),
    })
    .prefault({}),
  /**
   * HTTP/2 keepalive pings from the server (grpc-js `grpc.keepalive_time_ms` / `grpc.keepalive_timeout_ms`): a
   * connection whose peer vanished without a FIN (a node that lost power, a NAT that dropped the flow) is closed
   * after about timeMs + timeoutMs, its streams end and their sessions become resumable. 0 disables them.
   */
  keepalive: z
    .strictObject({
      timeMs: z.number().int().min(0).max(MAX_TIMER_MS).default(30_000),
      timeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(10_000),
    })
    .prefault({}),
  /**
   * The durable journal (src/journal/): accepted tasks, finished trajectories and acks in LMDB, so a restarted
   * server re-runs what was accepted and resumed sessions get what they had not acked. `dir: null` (default): none,
   * everything in memory.
   */
  journal: z
    .strictObject({
      dir: z.string().min(1).nullable().default(null),
      /** Bound on the journal's live data; past it (after compaction) admission fails with RESOURCE_EXHAUSTED. */
      maxBytes: z.number().int().min(1 << 20).default(1 << 30),
      /**
       * How long a task's accept (and any other write a client is answered on) waits for its commit: past it the
       * answer is UNAVAILABLE and RolloutService NOT_SERVING until a commit completes (a stuck disk, an NFS server
       * gone: an fsync that does not return must not keep the client waiting for good).
       */
      commitTimeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(30_000),
    })
    .prefault({}),
  /** Bearer token required on BackendService and AdminService calls when set (the same as `auth.adminToken`). */
  adminToken: tokenSchema.optional(),
  /**
   * Bearer tokens (`authorization: Bearer <token>`), printable ASCII without spaces (what an HTTP/2 header carries).
   * `token` guards RolloutService; `adminToken` guards BackendService and AdminService, which take `token` when
   * `adminToken` is unset (a trainer pauses and resumes generation around weight updates anyway). Neither set: all
   * open, for local use (the server warns). Health checking and reflection are always open. Give tokens through the
   * config file or the environment (ROLLOUT_TOKEN, ROLLOUT_ADMIN_TOKEN) or `--token-file`, never as a command-line
   * literal.
   */
  auth: z
    .strictObject({
      token: tokenSchema.optional(),
      adminToken: tokenSchema.optional(),
    })
    .prefault({}),
  /** Per HTTP/2 connection (grpc-js server options). */
  connections: z
    .strictObject({
      /**
       * Calls one connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS, grpc-js
       * `grpc.max_concurrent_streams`): each open call holds an HTTP/2 stream and what its handler waits with (a
       * GetTrajectory wait, a Watch's queue, a stream's session). Clients queue calls past it; a peer that ignores the
       * setting has the extra streams refused. Without it Node allows 2^32-1. Raise it for a trainer that keeps more
       * GetTrajectory(wait) calls open on one channel.
       */
      maxConcurrentStreams: z.number().int().min(1).max(2 ** 31 - 1).default(1024),
      /**
       * Unary calls one connection may have in flight at once (a GetTrajectory with `wait` holds its call until the
       * task finishes); one more is RESOURCE_EXHAUSTED naming this key, at once, while other connections are served.
       */
      maxUnaryInFlight: z.number().int().min(1).default(256),
      /**
       * Connections open at once on each listening address (node's `net.Server.maxConnections` on grpc-js's HTTP/2
       * server): one more is closed as it is accepted, before TLS or HTTP/2, and logged (rate-limited). Each connection
       * is bounded in its calls; without this a client opening connections in a loop would run the server out of file
       * descriptors (sandboxes, engine connections and the journal need them too). A trainer needs one per channel.
       */
      maxOpen: z.number().int().min(1).default(1024),
      /**
       * A connection with no call open this long is closed with an HTTP/2 GOAWAY (grpc-js `grpc.max_connection_idle_ms`);
       * a client's channel reconnects on its next call. A trainer's session or a dashboard's Watch keeps its connection
       * busy. 0 = never.
       */
      idleTimeoutMs: z.number().int().min(0).max(MAX_TIMER_MS).default(300_000),
      /**
       * A connection whose client has not finished its TLS handshake and sent its HTTP/2 settings this long after it
       * was accepted is closed (the idle timeout starts only then): a TCP connection that never speaks would hold one
       * of `maxOpen` places for ever. 0 = never.
       */
      handshakeTimeoutMs: z.number().int().min(0).max(MAX_TIMER_MS).default(20_000),
    })
    .prefault({}),
  /** Bounds of every call, whatever its service (src/contract/call-bounds.ts). */
  calls: z
    .strictObject({
      /**
       * A call whose first request message (the whole of it) or half-close has not arrived this long after its
       * headers is ended with DEADLINE_EXCEEDED naming this key: a client that opens calls and sends nothing would
       * hold them for ever. 0 = never. Generous: a unary Submit of a large task on a slow link is still uploading its
       * first message (5 min lets 64 MiB through ~0.2 MiB/s).
       */
      firstMessageTimeoutMs: z.number().int().min(0).max(MAX_TIMER_MS).default(300_000),
      /**
       * The deadline of a unary call that came without one (no grpc-timeout): past it the call ends DEADLINE_EXCEEDED
       * naming this key. A call with a deadline keeps its own. 0 = none.
       */
      unaryDeadlineMs: z.number().int().min(0).max(MAX_TIMER_MS).default(3_600_000),
      /**
       * Health Watch and reflection streams open at once, server-wide (they are answered without a token); one more is
       * ended RESOURCE_EXHAUSTED naming this key. A load balancer keeps one health Watch per server, grpcurl one
       * reflection stream per command. 0: both are refused (the unary health Check still answers).
       */
      maxOpenInfrastructureStreams: z.number().int().min(0).default(256),
    })
    .prefault({}),
  /** Watch streams (dashboards). */
  watch: z
    .strictObject({
      /**
       * Watches open at once, server-wide; one more is refused with RESOURCE_EXHAUSTED (0: Watch is refused). Each may
       * queue up to 4 MiB for a slow reader (64 MiB with full trajectories).
       */
      maxOpen: z.number().int().min(0).default(64),
      /**
       * A watch whose client stopped reading (its HTTP/2 window stayed shut, one write blocked this long, ms) is ended
       * with RESOURCE_EXHAUSTED: a hung dashboard that still answers keepalive pings would otherwise hold its maxOpen
       * slot, and its buffers, for good. 0 = never.
       */
      stalledMs: z.number().int().min(0).max(MAX_TIMER_MS).default(60_000),
    })
    .prefault({}),
  /**
   * Prometheus metrics over HTTP (GET /metrics): trajectories by environment and status, rewards, stage times, stage
   * pools, admission, sessions, token threads, each engine's load and health, the process. `port` null: off (the
   * default); 0: any free port. Bound to `host` (loopback by default). With `requireToken` (the default), a scrape
   * needs the admin token (auth.adminToken, else auth.token) as a bearer token whenever one is configured.
   */
  metrics: z
    .strictObject({
      port: z.number().int().min(0).max(65_535).nullable().default(null),
      host: z.string().min(1).default('127.0.0.1'),
      requireToken: z.boolean().default(true),
    })
    .prefault({}),
  /**
   * TLS: the server's certificate chain and key (PEM files); with `clientCaFile`, client certificates signed by that CA
   * are verified, and with `requireClientCert` a client without one is refused (mTLS). Unset: plaintext.
   */
  tls: z
    .strictObject({
      certFile: z.string().min(1),
      keyFile: z.string().min(1),
      clientCaFile: z.string().min(1).optional(),
      requireClientCert: z.boolean().default(false),
    })
    .refine((tls) => !tls.requireClientCert || tls.clientCaFile !== undefined, { message: 'requireClientCert needs clientCaFile', path: ['requireClientCert'] })
    .optional(),
  /**
   * On SIGTERM/SIGINT or AdminService.Drain: how long the work in flight may take before it is cancelled (delivered
   * with status CANCELLED), ms.
   */
  drainGraceMs: z.number().int().min(0).max(MAX_TIMER_MS).default(30_000),
});

export type ServerConfig = z.infer<typeof serverConfigSchema>;
export type ServerConfigInput = z.input<typeof serverConfigSchema>;

/**
 * Validates a configuration and applies defaults. Throws RolloutError('invalid_argument') whose message lists
 * every problem with its path (e.g. `Unrecognized key: "memroyMb" → at sandbox`), readable as it is on a terminal.
 */
export function parseConfig(input: unknown = {}): ServerConfig {
  const result = serverConfigSchema.safeParse(input);
  if (!result.success) throw configError(result.error);
  checkDetachedBound(result.data);
  checkBodyIdle(result.data, (input as { backendBodyIdleTimeoutMs?: unknown } | null | undefined)?.backendBodyIdleTimeoutMs !== undefined);
  return withJournalRetention(result.data, (input as { retainFinishedBytes?: unknown } | null | undefined)?.retainFinishedBytes !== undefined);
}

/**
 * sessions.maxDetachedBytes below maxUnackedBytes would drop a trainer's session the moment it detached full (a
 * network blip): refused, naming both.
 */
function checkDetachedBound(config: ServerConfig): void {
  const { maxDetachedBytes, maxUnackedBytes } = config.sessions;
  if (maxDetachedBytes >= maxUnackedBytes) return;
  throw new RolloutError(
    'invalid_argument',
    `invalid configuration: sessions.maxDetachedBytes (${maxDetachedBytes}) must be at least sessions.maxUnackedBytes (${maxUnackedBytes}): one trainer's session detached by a network blip, full, would be dropped at once`,
    { field: 'sessions.maxDetachedBytes' },
  );
}

/**
 * An explicit backendBodyIdleTimeoutMs longer than a set backendRequestTimeoutMs could never fire (the request's budget
 * ends first, as a timeout rather than a lost engine: no failover): refused, naming both. The default is left as it is
 * (a request timeout under 30 s then bounds stalled bodies too).
 */
function checkBodyIdle(config: ServerConfig, explicit: boolean): void {
  const { backendBodyIdleTimeoutMs: idle, backendRequestTimeoutMs: request } = config;
  if (!explicit || request === 0 || idle <= request) return;
  throw new RolloutError(
    'invalid_argument',
    `invalid configuration: backendBodyIdleTimeoutMs (${idle}) must be at most backendRequestTimeoutMs (${request}): a body stalled that long would end as a request timeout first, and its engine would never be read as lost`,
    { field: 'backendBodyIdleTimeoutMs' },
  );
}

/**
 * Finished tasks retained for GetTrajectory stay in the journal too (compaction keeps what memory still serves), so
 * with a journal their bytes must leave room under `journal.maxBytes` for running work (the journal stores them with
 * some overhead: hence 1.6). An explicit retainFinishedBytes that does not is refused, naming both fields; the
 * default is lowered to fit.
 */
function withJournalRetention(config: ServerConfig, explicit: boolean): ServerConfig {
  const { dir, maxBytes } = config.journal;
  if (dir === null || config.retainFinishedBytes * RETENTION_OVERHEAD < maxBytes) return config;
  if (!explicit) return { ...config, retainFinishedBytes: Math.floor(maxBytes / (2 * RETENTION_OVERHEAD)) };
  throw new RolloutError(
    'invalid_argument',
    `invalid configuration: retainFinishedBytes (${config.retainFinishedBytes}) times ${RETENTION_OVERHEAD} must be below journal.maxBytes (${maxBytes}): retained finished tasks stay in the journal, and would leave it no room to accept tasks`,
    { field: 'retainFinishedBytes' },
  );
}

const RETENTION_OVERHEAD = 1.6;

/** The sections a config file may hold that a caller merges flags into: each a list or an object, when present. */
const configShapeSchema = z.looseObject({
  backends: z.array(z.unknown()).optional(),
  model: z.union([z.string(), z.looseObject({})]).optional(),
  ...Object.fromEntries((['init', 'run', 'eval', 'sandbox', 'journal', 'metrics', 'auth', 'tls', 'sessions', 'keepalive', 'defaults', 'tokenWorkers', 'watch', 'connections', 'calls'] as const).map((key) => [key, z.looseObject({}).optional()])),
});

/**
 * Checks only the shape of a config (as read from a file) before flags are merged into it: `backends` a list, each
 * section an object (`model` also a string). Spreading a list or a number where an object belongs would otherwise
 * crash with a TypeError or silently drop what the file said. Throws like {@link parseConfig}, naming the field.
 */
export function checkConfigShape(input: unknown): void {
  const result = configShapeSchema.safeParse(input);
  if (!result.success) throw configError(result.error);
}

function configError(error: z.ZodError): RolloutError {
  const first = error.issues[0];
  const field = first ? first.path.map(String).join('.') : '';
  return new RolloutError('invalid_argument', `invalid configuration:\n${z.prettifyError(error)}`, { ...(field && { field }), cause: error });
}
