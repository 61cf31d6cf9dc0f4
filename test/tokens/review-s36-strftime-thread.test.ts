import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { setTemplateClockMs } from '../../src/tokens/chat-template.js';
import { loadModelBundle } from '../../src/tokens/model-bundle.js';
import { createTokenPool, TokenWork } from '../../src/tokens/token-work.js';
import { familyDir } from './families.js';

// Review s36, item 4, across threads: a token thread renders with the server's template clock (sent in its workerData),
// so a prompt rendered there prints the same date as one rendered on the event loop — also for a thread started (or
// restarted after a crash) on another day than the server's first render.

const dir = mkdtempSync(join(tmpdir(), 'review-s36-strftime-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('review s36: strftime_now on a token thread', () => {
  it('prints the server\u2019s date, not the thread\u2019s', async () => {
    cpSync(familyDir('qwen3'), dir, { recursive: true });
    const configPath = join(dir, 'tokenizer_config.json');
    const config = JSON.parse(readFileSync(configPath, 'utf8')) as { chat_template: string };
    config.chat_template = `{{ 'Date: ' + strftime_now('%Y-%m-%d') + '\\n' }}${config.chat_template}`;
    writeFileSync(configPath, JSON.stringify(config));
    // A server clock far from today's (as if the server had started rendering on another day than the thread).
    setTemplateClockMs(new Date(2001, 1, 3, 12).getTime());
    const bundle = await loadModelBundle({ dir });
    const pool = createTokenPool({ dir }, { size: 1 });
    try {
      const threaded = new TokenWork({ tokenizer: bundle.tokenizer, template: bundle.template, pool, inlineMaxChars: 0 });
      const inline = new TokenWork({ tokenizer: bundle.tokenizer, template: bundle.template });
      const messages = [{ role: 'user' as const, content: 'what is the date?' }];
      const ids = await threaded.promptIds(messages, undefined);
      expect(bundle.tokenizer.decode([...ids])).toMatch(/^Date: 2001-02-03\n/u);
      expect([...ids]).toEqual(inline.promptIdsSync(messages, undefined));
    } finally {
      await pool.close();
    }
  });
});
