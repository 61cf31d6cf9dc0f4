import type * as hf from '@huggingface/tokenizers';
import { libraryClasses, preTokenizers } from './library-fast-paths.js';

const { ByteLevelPreTokenizer } = libraryClasses;

/**
 * Speeds up @huggingface/tokenizers' ByteLevel pre-tokenizer (Qwen, Llama 3, DeepSeek) for ASCII text, where it is
 * most of the cost of encoding a short piece: for every pre-token it UTF-8-encodes the string with a TextEncoder, maps
 * each byte through an object and joins the characters again (~1 µs per pre-token; a 25-character question cost ~36 µs
 * to encode). For ASCII the bytes are the character codes, and GPT-2's byte alphabet writes the printable ones
 * (0x21-0x7E) as themselves, so a pre-token is only rewritten where it holds a space, a control character or DEL.
 * Anything else (one non-ASCII character in the text) goes to the library's own code. The library's splitting
 * (`use_regex`, `add_prefix_space`) is kept as it is. test/tokens/byte-level-fast.property.test.ts checks encodes with
 * and without this are equal for every ByteLevel family we ship.
 *
 * Patches the ByteLevel pre-tokenizer instances of one tokenizer (alone or inside a Sequence), nothing global; a
 * tokenizer without one, or whose byte alphabet is not GPT-2's, is left alone. Returns how many were patched.
 */
export function accelerateByteLevel(tokenizer: hf.Tokenizer): number {
  return preTokenizers(tokenizer).filter((node) => node instanceof ByteLevelPreTokenizer && patch(node)).length;
}

interface ByteLevelFields {
  add_prefix_space: boolean;
  use_regex: boolean;
  pattern: RegExp;
  byte_encoder: Record<number, string>;
  pre_tokenize_text(text: string, options?: unknown): string[];
}

const ASCII = /^[\x00-\x7f]*$/;
/** ASCII bytes the alphabet writes as another character. */
const REWRITTEN = /[\x00-\x20\x7f]/;
const REWRITTEN_ALL = /[\x00-\x20\x7f]/g;

/** Installs the fast path on one ByteLevel pre-tokenizer; false (left alone) when its byte alphabet is not GPT-2's. */
function patch(pre: object): boolean {
  const fields = pre as unknown as ByteLevelFields;
  const original = fields.pre_tokenize_text.bind(pre);
  const encoder = fields.byte_encoder;
  const table = new Map<string, string>();
  for (let b = 0; b < 0x80; b++) {
    const ch = String.fromCharCode(b);
    const written = encoder[b];
    if (typeof written !== 'string' || (REWRITTEN.test(ch) ? written === ch : written !== ch)) return false;
    table.set(ch, written);
  }
  const rewrite = (c: string): string => table.get(c)!;
  fields.pre_tokenize_text = (text: string, options?: unknown): string[] => {
    if (!ASCII.test(text)) return original(text, options);
    const prefixed = fields.add_prefix_space && !text.startsWith(' ') ? ` ${text}` : text;
    const tokens = fields.use_regex ? (prefixed.match(fields.pattern) ?? []) : [prefixed];
    return tokens.map((token) => (REWRITTEN.test(token) ? token.replace(REWRITTEN_ALL, rewrite) : token));
  };
  return true;
}
