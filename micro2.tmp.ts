import { loadModelBundle } from './src/tokens/model-bundle.js';
import { environmentDelta, probeAssistantClosing } from './src/tokens/template-delta.js';
import { encodeRendered } from './src/tokens/opaque-content.js';
const b = await loadModelBundle({});
const line = 'INFO 2026-11-24 worker[3] processed batch 1234 in 56 ms: ok (items=789, retries=0)\n';
const big = line.repeat(Math.ceil(240_000 / line.length));
const t0 = performance.now(); const ids = encodeRendered(b.tokenizer, big); console.log('encode big', (performance.now() - t0).toFixed(1), 'ms', ids.length, 'tokens', big.length, 'chars');
const hist = [{ role: 'system' as const, content: 'sys' }, { role: 'user' as const, content: big }, { role: 'assistant' as const, content: '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>' }];
for (let i = 0; i < 3; i++) {
  const s = performance.now(); const txt = b.template.render(hist, { addGenerationPrompt: true }); const r = performance.now() - s;
  const s2 = performance.now(); environmentDelta(b.template, { history: hist, added: [{ role: 'tool', content: 'ok' }], tools: undefined, closing: probeAssistantClosing(b.template, undefined) }); const d = performance.now() - s2;
  console.log('render', r.toFixed(2), 'ms; environmentDelta', d.toFixed(2), 'ms', txt.length);
}
const many = [{ role: 'user' as const, content: 'q' }];
for (let i = 0; i < 40; i++) many.push({ role: 'assistant' as never, content: line.repeat(10) }, { role: 'tool' as never, content: line.repeat(60) });
many.push({ role: 'assistant' as never, content: 'x' });
const tx = b.template.render(many, { addGenerationPrompt: true });
console.log('many chars', tx.length, 'tokens', encodeRendered(b.tokenizer, tx).length);
for (let i = 0; i < 3; i++) {
  const s2 = performance.now(); environmentDelta(b.template, { history: many, added: [{ role: 'tool', content: 'ok' }], tools: undefined, closing: probeAssistantClosing(b.template, undefined) }); console.log('many delta', (performance.now() - s2).toFixed(2));
}
