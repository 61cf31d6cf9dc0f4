import { add, div, isInteger, mul, neg, pow, rational, real, root, sub, type Num } from './rational.js';

/**
 * A small, safe evaluator for the arithmetic that appears in final answers: numbers (1,000 is handled by the
 * normaliser; 1.5, .5, 1e3, 1.5E-3 here), + − * / ^, \cdot \times \div, parentheses and braces, \frac{a}{b}
 * (and LaTeX's \frac12), \sqrt{x}, \sqrt[n]{x}, \pi, mixed numbers (2\frac{1}{2} = 2.5), implicit products
 * (2\sqrt{3}, 3(4)) and a postfix %.
 *
 * Why hand-written: answers are untrusted model output, so no JS eval and no general CAS. A recursive-descent
 * parser over at most {@link MAX_EXPRESSION_LENGTH} characters with a nesting cap runs in linear time and
 * cannot hang; anything it does not understand makes the answer "not a number" (compared as text instead).
 */
export const MAX_EXPRESSION_LENGTH = 1000;
const MAX_DEPTH = 64;

/** How a postfix % is read: 'scale' makes 50% = 1/2, 'drop' makes 50% = 50. */
export type PercentMode = 'scale' | 'drop';

export interface ParsedNumber {
  value: Num;
  /** Whether a % sign occurred; if not, both percent modes give the same value. */
  hasPercent: boolean;
}

class ParseFailure extends Error {}

function fail(): never {
  throw new ParseFailure();
}

const VALUE_COMMANDS = ['\\frac', '\\sqrt', '\\pi'];
const MIXED_FRACTION = /^\\frac\s*(?:\{\s*\d+\s*\}|\d)\s*(?:\{\s*\d+\s*\}|\d)/;
const ONE_HUNDREDTH = rational(1n, 100n);

class Parser {
  private pos = 0;
  private depth = 0;
  hasPercent = false;

  constructor(
    private readonly s: string,
    private readonly percent: PercentMode,
  ) {}

  parse(): Num {
    const value = this.expr();
    this.ws();
    if (this.pos !== this.s.length) fail();
    return value;
  }

  private ws(): void {
    while (this.pos < this.s.length && /\s/.test(this.s[this.pos]!)) this.pos++;
  }

  private peek(): string {
    this.ws();
    return this.s[this.pos] ?? '';
  }

  /** Consumes `word` if it is next (a command must not run on into more letters: \pi is not \pie). */
  private eat(word: string): boolean {
    this.ws();
    if (!this.s.startsWith(word, this.pos)) return false;
    const after = this.s[this.pos + word.length] ?? '';
    if (/^\\[a-z]+$/i.test(word) && /[a-z]/i.test(after)) return false;
    this.pos += word.length;
    return true;
  }

  private enter(): void {
    if (++this.depth > MAX_DEPTH) fail();
  }

  private expr(): Num {
    this.enter();
    let left = this.term();
    for (;;) {
      if (this.eat('+')) left = add(left, this.term());
      else if (this.eat('-')) left = sub(left, this.term());
      else break;
    }
    this.depth--;
    return left;
  }

  private term(): Num {
    let left = this.unary();
    for (;;) {
      if (this.eat('*') || this.eat('\\cdot') || this.eat('\\times')) left = mul(left, this.unary());
      else if (this.eat('/') || this.eat('\\div')) left = div(left, this.unary()) ?? fail();
      else if (this.startsImplicitFactor()) left = mul(left, this.power());
      else break;
    }
    return left;
  }

  /** A factor that may follow another without an operator: "2\sqrt{3}", "3(4)", "2\pi". Never a digit. */
  private startsImplicitFactor(): boolean {
    const c = this.peek();
    if (c === '(' || c === '{') return true;
    return VALUE_COMMANDS.some((cmd) => this.s.startsWith(cmd, this.pos));
  }

  private unary(): Num {
    this.enter();
    let value: Num;
    if (this.eat('-')) value = neg(this.unary());
    else if (this.eat('+')) value = this.unary();
    else value = this.power();
    this.depth--;
    return value;
  }

  /** Right-associative; "2^10" is 1024 (plain-text reading), "2^{10}" too. */
  private power(): Num {
    const base = this.postfix();
    if (!this.eat('^')) return base;
    const exponent = this.peek() === '{' ? this.group('{', '}') : this.unary();
    return pow(base, exponent) ?? fail();
  }

  private postfix(): Num {
    let value = this.primary();
    while (this.eat('%')) {
      this.hasPercent = true;
      if (this.percent === 'scale') value = mul(value, ONE_HUNDREDTH);
    }
    return value;
  }

  private primary(): Num {
    const c = this.peek();
    if (c === '(') return this.group('(', ')');
    if (c === '{') return this.group('{', '}');
    if (/[0-9.]/.test(c)) return this.numberWithMixedFraction();
    if (this.eat('\\frac')) return this.fraction();
    if (this.eat('\\sqrt')) return this.sqrt();
    if (this.eat('\\pi')) return real(Math.PI);
    return fail();
  }

  private group(open: string, close: string): Num {
    this.enter();
    if (!this.eat(open)) fail();
    const value = this.expr();
    if (!this.eat(close)) fail();
    this.depth--;
    return value;
  }

  private fraction(): Num {
    const numerator = this.latexArgument();
    const denominator = this.latexArgument();
    return div(numerator, denominator) ?? fail();
  }

  private sqrt(): Num {
    let k = 2;
    if (this.peek() === '[') {
      const index = this.group('[', ']');
      if (!isInteger(index) || index.n < 2n || index.n > 64n) fail();
      k = Number(index.n);
    }
    return root(this.latexArgument(), k) ?? fail();
  }

  /** A LaTeX macro argument: {group}, (group) for plain-text "\sqrt(2)", one digit as in \frac12, or \pi. */
  private latexArgument(): Num {
    const c = this.peek();
    if (c === '{') return this.group('{', '}');
    if (c === '(') return this.group('(', ')');
    if (/[0-9]/.test(c)) {
      this.pos++;
      return rational(BigInt(c));
    }
    if (this.eat('\\pi')) return real(Math.PI);
    return fail();
  }

  /**
   * A literal. An integer literal followed by \frac of two integer literals forming a proper fraction is a
   * mixed number (2\frac12 = 5/2), as in textbook answers; any other \frac after a number is a product.
   */
  private numberWithMixedFraction(): Num {
    const whole = this.number();
    this.ws();
    if (!isInteger(whole) || !MIXED_FRACTION.test(this.s.slice(this.pos, this.pos + 64))) return whole;
    const start = this.pos;
    this.eat('\\frac');
    const part = this.fraction();
    if (part.exact && part.n > 0n && part.n < part.d) return add(whole, part);
    this.pos = start;
    return whole;
  }

  private number(): Num {
    const m = /^(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?/.exec(this.s.slice(this.pos, this.pos + MAX_EXPRESSION_LENGTH));
    const [text = '', intPart = '', fracPart = '', expPart] = m ?? [];
    if (intPart === '' && fracPart === '') fail();
    this.pos += text.length;
    const digits = BigInt(intPart + fracPart);
    const exp = (expPart === undefined ? 0 : Number(expPart)) - fracPart.length;
    if (Math.abs(exp) > 4000) {
      const x = Number(text);
      return Number.isFinite(x) ? real(x) : fail();
    }
    return exp >= 0 ? rational(digits * 10n ** BigInt(exp)) : rational(digits, 10n ** BigInt(-exp));
  }
}

/**
 * Parses a normalised answer as a number, or returns undefined when it is not (only) arithmetic.
 * Never throws; returns undefined for non-finite results and inputs over {@link MAX_EXPRESSION_LENGTH}.
 */
export function parseNumber(text: string, percent: PercentMode = 'scale'): ParsedNumber | undefined {
  if (text.length === 0 || text.length > MAX_EXPRESSION_LENGTH) return undefined;
  const parser = new Parser(text, percent);
  try {
    const value = parser.parse();
    if (!value.exact && !Number.isFinite(value.x)) return undefined;
    return { value, hasPercent: parser.hasPercent };
  } catch {
    // ParseFailure for text that is not arithmetic; anything else (a RangeError from BigInt) means the same.
    return undefined;
  }
}
