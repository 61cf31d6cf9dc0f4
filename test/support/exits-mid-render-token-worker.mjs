// TEST DOUBLE: the real token worker (src/tokens/token-worker.ts), except that encoding a rendered text that holds
// EXIT-IN-RENDER ends the thread (exit code 9) from inside the task: a thread dying in the middle of its work
// (the template rendered, the tokenizer under way), not between two messages.
import { register } from 'tsx/esm/api';

register();
const { HfTokenizer } = await import('../../src/tokens/tokenizer.ts');
const encodeParts = HfTokenizer.prototype.encodeParts;
HfTokenizer.prototype.encodeParts = function (parts) {
  if (parts.some((p) => p.text.includes('EXIT-IN-RENDER'))) process.exit(9);
  return encodeParts.call(this, parts);
};
await import('../../src/tokens/token-worker.ts');
