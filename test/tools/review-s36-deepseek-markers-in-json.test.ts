import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import type { ModelBundle } from '../../src/tokens/model-bundle.js';
import { DeepSeekV3ToolCallParser } from '../../src/tools/deepseek-v3-parser.js';
import { loadFamily } from '../tokens/families.js';

// Review s36, item 2. DeepSeek-V3's markers (<｜tool▁calls▁begin｜>, <｜tool▁call▁end｜>, ...) are added tokens of its
// vocabulary ("special": false, so decoding keeps them), and its tokenizer turns their text into those ids wherever it
// appears — inside a JSON string of a call's arguments too (see the first test). So the model learned calls whose
// arguments hold the marker's very id: neither the text nor the ids tell a marker inside a JSON string from the
// format's own. The call's structure does: a call ends at the <｜tool▁call▁end｜> after its arguments' JSON value and
// closing fence, not at the first one in the text, and the block at the first <｜tool▁calls▁end｜> outside a call.

const CALLS_BEGIN = '<｜tool▁calls▁begin｜>';
const CALLS_END = '<｜tool▁calls▁end｜>';
const CALL_BEGIN = '<｜tool▁call▁begin｜>';
const CALL_END = '<｜tool▁call▁end｜>';
const SEP = '<｜tool▁sep｜>';
const MARKERS = [CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP];

const parser = new DeepSeekV3ToolCallParser();
let deepseek: ModelBundle;
beforeAll(async () => {
  deepseek = await loadFamily('deepseek_v3');
});

describe('review s36: DeepSeek-V3 markers inside a call\u2019s JSON arguments', () => {
  it('the tokenizer encodes a marker inside a JSON string as the marker\u2019s own added-token id (so ids cannot tell them apart)', () => {
    const { tokenizer } = deepseek;
    for (const marker of MARKERS) {
      const id = tokenizer.tokenId(marker)!;
      expect(id).toBeGreaterThan(0);
      expect(tokenizer.encode(JSON.stringify({ code: `x = '${marker}'` }))).toContain(id);
      expect(tokenizer.decode([id])).toBe(marker); // kept when decoded: the parser sees it as text
    }
  });

  it('reads a call whose code holds <｜tool▁call▁end｜> and <｜tool▁calls▁end｜> as that call, from sampled ids', () => {
    const code = `END = "${CALL_END}"\nALL = "${CALLS_END}"\nprint(END, ALL)`;
    const text = parser.format([{ name: 'python', arguments: { code } }]);
    // As the model samples it: the canonical ids, the markers in the string as their added-token ids.
    const ids = deepseek.tokenizer.encode(text);
    const parsed = parser.parse(deepseek.tokenizer.decode(ids));
    expect(parsed).toEqual({ calls: [{ name: 'python', arguments: { code } }], errors: [] });
  });

  it('keeps the calls after one whose arguments hold every marker, and ends the block at the calls-end outside them', () => {
    const calls = [
      { name: 'python', arguments: { code: MARKERS.join('\n```\n') } },
      { name: 'bash', arguments: { cmd: 'echo ok' } },
    ];
    const text = `${parser.format(calls)}\n${CALL_BEGIN}function${SEP}bash\n\`\`\`json\n{"cmd": "after the block"}\n\`\`\`${CALL_END}`;
    expect(parser.parse(`Let me run it.\n${text}`)).toEqual({ calls, errors: [] });
  });

  it('round-trips any string arguments, markers, fences and newlines included (format then parse)', () => {
    const piece = fc.oneof(fc.string(), fc.constantFrom(...MARKERS, '```', '\n```', '```json\n', '"', '\\', '}', '{', '\n'));
    fc.assert(
      fc.property(fc.array(fc.array(piece, { maxLength: 6 }).map((p) => p.join('')), { minLength: 1, maxLength: 3 }), (codes) => {
        const calls = codes.map((code) => ({ name: 'python', arguments: { code } }));
        expect(parser.parse(parser.format(calls))).toEqual({ calls, errors: [] });
      }),
      { numRuns: 300 },
    );
  });

  it('still ends a call at its end tag when its JSON is broken (an error for it, the next call read)', () => {
    const text = `${CALLS_BEGIN}${CALL_BEGIN}function${SEP}python\n\`\`\`json\n{"code": "unterminated}\n\`\`\`${CALL_END}\n${CALL_BEGIN}function${SEP}bash\n\`\`\`json\n{"cmd": "ls"}\n\`\`\`${CALL_END}${CALLS_END}`;
    const parsed = parser.parse(text);
    expect(parsed.calls).toEqual([{ name: 'bash', arguments: { cmd: 'ls' } }]);
    expect(parsed.errors).toHaveLength(1);
    expect(parsed.errors[0]).toMatch(/^tool call 1: python: invalid JSON/u);
  });
});
