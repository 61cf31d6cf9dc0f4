/**
 * Small deterministic helpers for the test doubles: a seeded random stream and integer arithmetic problems.
 * Deterministic so that a scripted rollout can be replayed exactly from its seed.
 */

/** Mixes integers into one 32-bit hash (murmur3 finalizer per word); same inputs, same hash, on every run. */
export function hashInts(...values: readonly number[]): number {
  let h = 0x9e3779b9;
  for (const v of values) {
    let k = Math.imul(v | 0, 0xcc9e2d51) ^ Math.floor(v / 0x100000000);
    k = Math.imul((k << 15) | (k >>> 17), 0x1b873593);
    h ^= k;
    h = Math.imul((h << 13) | (h >>> 19), 5) + 0xe6546b64;
  }
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/** A uniform [0, 1) stream from a 32-bit seed (mulberry32): tiny, fast and good enough for test scripts. */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A math task as the scripted policy understands it. */
export interface MathProblem {
  /** The user's message, always `What is <expression>?`. */
  question: string;
  /** Integer arithmetic with + - * and parentheses, e.g. `17 * 23 + 5`. */
  expression: string;
  answer: number;
}

/** The phrasing the scripted policy looks for; the capture group is the expression. */
export const MATH_QUESTION_PATTERN = /What is ([0-9+\-*() ]+)\?/;

/** Wraps an expression in the one phrasing the scripted policy recognises. */
export function mathProblem(expression: string): MathProblem {
  return { question: `What is ${expression}?`, expression, answer: evaluateArithmetic(expression) };
}

/** A random problem of the shape `a * b + c` (operators and sizes vary with the seed). */
export function makeMathProblem(seed: number): MathProblem {
  const random = seededRandom(hashInts(seed, 0x6d617468));
  const int = (lo: number, hi: number): number => lo + Math.floor(random() * (hi - lo + 1));
  const ops = ['+', '-', '*'] as const;
  const op = (): string => ops[int(0, ops.length - 1)]!;
  const expression = `${int(2, 49)} ${op()} ${int(2, 29)} ${op()} ${int(1, 99)}`;
  return mathProblem(expression);
}

/**
 * Evaluates integer + - * with parentheses and the usual precedence (no `eval`). Throws on anything else,
 * so a problem that the policy cannot parse fails loudly in the test that made it.
 */
export function evaluateArithmetic(expression: string): number {
  const tokens = expression.match(/\d+|[-+*()]|\S/g) ?? [];
  let pos = 0;
  const peek = (): string | undefined => tokens[pos];
  const expect = (t: string): void => {
    if (tokens[pos++] !== t) throw new Error(`expected "${t}" in "${expression}"`);
  };
  const atom = (): number => {
    const t = tokens[pos++];
    if (t === '(') {
      const v = sum();
      expect(')');
      return v;
    }
    if (t === '-') return -atom();
    if (t === undefined || !/^\d+$/.test(t)) throw new Error(`unexpected "${t ?? 'end'}" in "${expression}"`);
    return Number(t);
  };
  const product = (): number => {
    let v = atom();
    while (peek() === '*') {
      pos++;
      v *= atom();
    }
    return v;
  };
  const sum = (): number => {
    let v = product();
    for (let t = peek(); t === '+' || t === '-'; t = peek()) {
      pos++;
      v = t === '+' ? v + product() : v - product();
    }
    return v;
  };
  const value = sum();
  if (pos !== tokens.length) throw new Error(`trailing "${tokens[pos]}" in "${expression}"`);
  return value;
}
