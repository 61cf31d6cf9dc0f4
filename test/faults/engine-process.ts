// TEST DOUBLE in its own process: a fake vLLM engine that a test can kill -9 mid-turn. It prints its URL as one
// JSON line on stdout once it listens, then serves until killed. argv[2]: token latency in ms.
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';

const { tokenizer } = await loadQwen3();
const engine = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: Number(process.argv[2] ?? '0') });
process.stdout.write(`${JSON.stringify({ url: engine.url, model: engine.model })}\n`);
