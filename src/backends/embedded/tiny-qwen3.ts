import { createHash, randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readFile, rename, rm } from 'node:fs/promises';
import { Worker } from 'node:worker_threads';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { qwen3ModelDir } from '../../tokens/tokenizer.js';
import { writeGguf, type GgufTensor, type GgufValue } from './gguf-writer.js';
import { seededRandom } from '../../testing/arithmetic.js';

/**
 * Shape of the tiny random-weight Qwen3 the project writes for local runs and tests. The vocabulary is always
 * the real Qwen3 one (151,669 ids), so its token ids mean what the server's tokenizer and chat template say;
 * everything else is small enough that writing, loading and generating take well under a second each on a CPU.
 */
export interface TinyQwen3Shape {
  embedding: number;
  layers: number;
  heads: number;
  kvHeads: number;
  /** Per-head dimension (Qwen3 states it explicitly: attention.key_length). */
  headDim: number;
  feedForward: number;
  /** The context length the model declares (qwen3.context_length). */
  contextLength: number;
  /** Seed of the weights: the same seed and shape give the same bytes. */
  seed: number;
  /** Standard deviation of the embedding (tied with the output): larger makes the next-token distribution peakier. */
  embeddingStd: number;
}

export const DEFAULT_TINY_QWEN3: TinyQwen3Shape = Object.freeze({
  embedding: 64,
  layers: 2,
  heads: 4,
  kvHeads: 2,
  headDim: 16,
  feedForward: 128,
  contextLength: 8192,
  seed: 1,
  embeddingStd: 0.5,
});

/** Bumped whenever the bytes written for a given shape change, so stale cached files are never reused. */
const WRITER_VERSION = 1;

/** `<project>/.cache/models`, beside the image cache; ignored by git. */
export const DEFAULT_MODEL_CACHE_DIR = fileURLToPath(new URL('../../../.cache/models', import.meta.url));

/** Token types of llama.cpp's vocabulary (llama_token_type). */
const TOKEN_NORMAL = 1;
const TOKEN_CONTROL = 3;
const TOKEN_USER_DEFINED = 4;

interface QwenTokenizerFiles {
  json: { model: { vocab: Record<string, number>; merges: (string | [string, string])[] }; added_tokens: { id: number; content: string; special: boolean }[] };
  chatTemplate: string | undefined;
  hash: string;
}

function readQwen3TokenizerFiles(): QwenTokenizerFiles {
  const dir = qwen3ModelDir();
  const raw = readFileSync(join(dir, 'tokenizer.json'));
  const configRaw = readFileSync(join(dir, 'tokenizer_config.json'));
  const config = JSON.parse(configRaw.toString('utf8')) as { chat_template?: unknown };
  return {
    json: JSON.parse(raw.toString('utf8')) as QwenTokenizerFiles['json'],
    chatTemplate: typeof config.chat_template === 'string' ? config.chat_template : undefined,
    hash: createHash('sha256').update(raw).update(configRaw).digest('hex'),
  };
}

/**
 * Writes the tiny Qwen3 GGUF at `path`: architecture `qwen3` (supported by the llama.cpp inside node-llama-cpp),
 * the real Qwen3 byte-level BPE vocabulary (`tokenizer.ggml.model = gpt2`, pre-tokenizer `qwen2`, tokens, token
 * types — control for special added tokens, user-defined for the others such as <tool_call> — and merges), eos
 * <|im_end|>, no BOS added, Qwen3's chat template, and seeded uniform random weights: F16 matrices, F32 norms (all
 * ones). The output projection is tied to the embedding (no output.weight), as in small Qwen3 checkpoints.
 */
export function writeTinyQwen3Gguf(path: string, shape: TinyQwen3Shape = DEFAULT_TINY_QWEN3, files: QwenTokenizerFiles = readQwen3TokenizerFiles()): void {
  const { json } = files;
  const added = new Map(json.added_tokens.map((t) => [t.id, t]));
  let vocabSize = 0;
  for (const id of Object.values(json.model.vocab)) vocabSize = Math.max(vocabSize, id + 1);
  for (const id of added.keys()) vocabSize = Math.max(vocabSize, id + 1);
  const tokens = new Array<string>(vocabSize);
  const types = new Int32Array(vocabSize).fill(TOKEN_NORMAL);
  for (const [text, id] of Object.entries(json.model.vocab)) tokens[id] = text;
  for (const [id, t] of added) {
    tokens[id] = t.content;
    types[id] = t.special ? TOKEN_CONTROL : TOKEN_USER_DEFINED;
  }
  for (let id = 0; id < vocabSize; id++) {
    if (tokens[id] === undefined) throw new Error(`Qwen3 vocabulary has no token ${id}`);
  }
  const merges = json.model.merges.map((m) => (typeof m === 'string' ? m : `${m[0]} ${m[1]}`));
  const idOf = (content: string): number => {
    const id = json.model.vocab[content] ?? json.added_tokens.find((t) => t.content === content)?.id;
    if (id === undefined) throw new Error(`Qwen3 vocabulary lacks ${content}`);
    return id;
  };

  const a = 'qwen3';
  const meta = new Map<string, GgufValue>([
    ['general.architecture', { type: 'string', value: a }],
    ['general.name', { type: 'string', value: `tiny-random-qwen3-${shape.embedding}x${shape.layers}-seed${shape.seed}` }],
    [`${a}.context_length`, { type: 'u32', value: shape.contextLength }],
    [`${a}.embedding_length`, { type: 'u32', value: shape.embedding }],
    [`${a}.block_count`, { type: 'u32', value: shape.layers }],
    [`${a}.feed_forward_length`, { type: 'u32', value: shape.feedForward }],
    [`${a}.attention.head_count`, { type: 'u32', value: shape.heads }],
    [`${a}.attention.head_count_kv`, { type: 'u32', value: shape.kvHeads }],
    [`${a}.attention.key_length`, { type: 'u32', value: shape.headDim }],
    [`${a}.attention.value_length`, { type: 'u32', value: shape.headDim }],
    [`${a}.attention.layer_norm_rms_epsilon`, { type: 'f32', value: 1e-6 }],
    [`${a}.rope.freq_base`, { type: 'f32', value: 1_000_000 }],
    ['tokenizer.ggml.model', { type: 'string', value: 'gpt2' }],
    ['tokenizer.ggml.pre', { type: 'string', value: 'qwen2' }],
    ['tokenizer.ggml.tokens', { type: 'string[]', value: tokens }],
    ['tokenizer.ggml.token_type', { type: 'i32[]', value: types }],
    ['tokenizer.ggml.merges', { type: 'string[]', value: merges }],
    ['tokenizer.ggml.eos_token_id', { type: 'u32', value: idOf('<|im_end|>') }],
    ['tokenizer.ggml.padding_token_id', { type: 'u32', value: idOf('<|endoftext|>') }],
    ['tokenizer.ggml.bos_token_id', { type: 'u32', value: idOf('<|endoftext|>') }],
    ['tokenizer.ggml.add_bos_token', { type: 'bool', value: false }],
    ...(files.chatTemplate !== undefined ? ([['tokenizer.chat_template', { type: 'string', value: files.chatTemplate }]] as const) : []),
  ]);

  const random = seededRandom(shape.seed);
  /** Uniform in [-r, r] with r = std·√3, i.e. the given standard deviation. */
  const matrix = (name: string, cols: number, rows: number, std: number): GgufTensor => {
    const data = new Float32Array(cols * rows);
    const r = std * Math.sqrt(3);
    for (let i = 0; i < data.length; i++) data[i] = (2 * random() - 1) * r;
    return { name, dims: [cols, rows], data, f16: true };
  };
  const ones = (name: string, n: number): GgufTensor => ({ name, dims: [n], data: new Float32Array(n).fill(1) });
  const { embedding: d, headDim, heads, kvHeads, feedForward: ff } = shape;
  const tensors: GgufTensor[] = [matrix('token_embd.weight', d, vocabSize, shape.embeddingStd), ones('output_norm.weight', d)];
  for (let l = 0; l < shape.layers; l++) {
    const blk = `blk.${l}`;
    tensors.push(
      ones(`${blk}.attn_norm.weight`, d),
      matrix(`${blk}.attn_q.weight`, d, headDim * heads, 1 / Math.sqrt(d)),
      matrix(`${blk}.attn_k.weight`, d, headDim * kvHeads, 1 / Math.sqrt(d)),
      matrix(`${blk}.attn_v.weight`, d, headDim * kvHeads, 1 / Math.sqrt(d)),
      matrix(`${blk}.attn_output.weight`, headDim * heads, d, 1 / Math.sqrt(headDim * heads)),
      ones(`${blk}.attn_q_norm.weight`, headDim),
      ones(`${blk}.attn_k_norm.weight`, headDim),
      ones(`${blk}.ffn_norm.weight`, d),
      matrix(`${blk}.ffn_gate.weight`, d, ff, 1 / Math.sqrt(d)),
      matrix(`${blk}.ffn_up.weight`, d, ff, 1 / Math.sqrt(d)),
      matrix(`${blk}.ffn_down.weight`, ff, d, 1 / Math.sqrt(ff)),
    );
  }
  writeGguf(path, meta, tensors);
}

/**
 * The path of the tiny Qwen3 GGUF for `shape`, writing it first when the cache does not hold it. The file name
 * carries a hash of the writer version, the shape and the tokenizer files, so a changed input never reuses a stale
 * file; the file is written under a temporary name and renamed, so concurrent callers (parallel test files) never
 * see a partial model. The writing runs on a worker thread: about a second of CPU (seeded weights, F16 conversion)
 * and ~19 MB of writes that would otherwise stall the server's event loop the first time an embedded engine loads.
 */
export async function ensureTinyQwen3Gguf(shape: TinyQwen3Shape = DEFAULT_TINY_QWEN3, cacheDir: string = DEFAULT_MODEL_CACHE_DIR): Promise<string> {
  const dir = qwen3ModelDir();
  const [raw, configRaw] = await Promise.all([readFile(join(dir, 'tokenizer.json')), readFile(join(dir, 'tokenizer_config.json'))]);
  const tokenizerHash = createHash('sha256').update(raw).update(configRaw).digest('hex');
  const key = createHash('sha256').update(JSON.stringify({ WRITER_VERSION, shape, tokenizer: tokenizerHash })).digest('hex').slice(0, 16);
  const path = join(cacheDir, `tiny-qwen3-${key}.gguf`);
  if (existsSync(path)) return path;
  await mkdir(cacheDir, { recursive: true });
  const tmp = `${path}.${process.pid}.${Date.now()}.${randomUUID().slice(0, 8)}.tmp`;
  try {
    await writeOnWorker(tmp, shape);
    await rename(tmp, path);
  } finally {
    await rm(tmp, { force: true });
  }
  return path;
}

function writeOnWorker(path: string, shape: TinyQwen3Shape): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const worker = new Worker(new URL('./tiny-qwen3-worker-entry.mjs', import.meta.url), { workerData: { path, shape } });
    let written = false;
    worker.once('message', () => (written = true));
    worker.once('error', reject);
    worker.once('exit', (code) => (written ? resolve() : reject(new Error(`writing the tiny Qwen3 GGUF failed: its worker exited with code ${code}`))));
  });
}
