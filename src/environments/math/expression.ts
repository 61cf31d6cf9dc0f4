import { absolute, add, div, errorOf, isInteger, mul, neg, pow, PrecisionLost, rational, real, root, sub, toFloat, type Num } from './rational.js';

/**
 * A small, safe evaluator for the expressions that appear in final answers: numbers (1,000 is handled by the
 * normaliser; 1.5, .5, 1e3, 1.5E-3 here), + − * / ^, \cdot \times \div, parentheses and braces, \frac{a}{b}
 * (and LaTeX's \frac12), \sqrt{x}, \sqrt[n]{x}, \pi, e, mixed numbers (2\frac{1}{2} = 2.5), implicit products
 * (2\sqrt{3}, 3(4), 2x, xy), a postfix % and !, |x|, the usual functions (\sin … \arctan, \sinh … \tanh, \ln,
 * \log, \log_b, \exp, with powers such as \sin^2 x) and variables (one Latin letter or a Greek command, with an
 * optional subscript: x, y_1, \theta).
 *
 * Variables get their values from the caller: none are allowed by {@link parseNumber} (a number is a number), and
 * {@link evaluateExpression} assigns them, so that two answers with variables can be compared by evaluating both
 * at the same points (see equivalence.ts).
 *
 * Why hand-written: answers are untrusted model output, so no JS eval and no general CAS. A recursive-descent
 * parser over at most {@link MAX_EXPRESSION_LENGTH} characters with a nesting cap runs in linear time and
 * cannot hang; anything it does not understand makes the answer "not an expression" (compared as text instead).
 */
export const MAX_EXPRESSION_LENGTH = 1000;
const MAX_DEPTH = 64;

/** How a postfix % is read: 'scale' makes 50% = 1/2, 'drop' makes 50% = 50. */
export type PercentMode = 'scale' | 'drop';

export interface ParsedNumber {
  value: Num;
  /** Whether a % sign occurred; if not, both percent modes give the same value. */
  hasPercent: boolean;
  /** Whether a decimal literal (1.5, .5, 3.0) occurred: math-verify compares such answers rounded to 6 places. */
  hasDecimal: boolean;
  /** Whether the text is one integer literal, perhaps signed and followed by % ("9%", "-3"). */
  integerLiteral: boolean;
}

/** The text is not an expression this parser reads. */
class ParseFailure extends Error {}
/** The text is an expression, but undefined at this point (ln of a negative, division by zero). */
class DomainFailure extends Error {}

function fail(): never {
  throw new ParseFailure();
}

function undefinedHere(): never {
  throw new DomainFailure();
}

const ONE_HUNDREDTH = rational(1n, 100n);
const MIXED_FRACTION = /^\\frac\s*(?:\{\s*\d+\s*\}|\d)\s*(?:\{\s*\d+\s*\}|\d)/;
const GREEK =
  'alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|sigma|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi|Psi|Omega';
const GREEK_RE = new RegExp(`^\\\\(?:${GREEK})(?![a-zA-Z])`);

/**
 * Functions of one real argument, each with a bound on its slope |f'| near x (how much an error of the argument
 * grows). A result that is not finite means "undefined at this point", except for the functions in {@link GROWING},
 * whose infinite result is an overflow (see {@link PrecisionLost}).
 */
const FUNCTIONS: Readonly<Record<string, { f: (x: number) => number; slope: (x: number) => number }>> = {
  sin: { f: Math.sin, slope: () => 1 },
  cos: { f: Math.cos, slope: () => 1 },
  tan: { f: Math.tan, slope: (x) => 1 + Math.tan(x) ** 2 },
  cot: { f: (x) => 1 / Math.tan(x), slope: (x) => 1 + 1 / Math.tan(x) ** 2 },
  sec: { f: (x) => 1 / Math.cos(x), slope: (x) => Math.abs(Math.tan(x) / Math.cos(x)) },
  csc: { f: (x) => 1 / Math.sin(x), slope: (x) => Math.abs(1 / (Math.tan(x) * Math.sin(x))) },
  arcsin: { f: Math.asin, slope: (x) => 1 / Math.sqrt(1 - x * x) },
  arccos: { f: Math.acos, slope: (x) => 1 / Math.sqrt(1 - x * x) },
  arctan: { f: Math.atan, slope: () => 1 },
  sinh: { f: Math.sinh, slope: Math.cosh },
  cosh: { f: Math.cosh, slope: Math.cosh },
  tanh: { f: Math.tanh, slope: () => 1 },
  ln: { f: Math.log, slope: (x) => 1 / Math.abs(x) },
  exp: { f: Math.exp, slope: Math.exp },
};
const GROWING: ReadonlySet<string> = new Set(['sinh', 'cosh', 'exp']);
/**
 * Largest error of an argument, relative to max(1, |x|), that a function is evaluated with: the slope is taken at
 * the ends of [x − e, x + e], which only bounds it on a short interval (not across a pole of tan).
 */
const MAX_ARGUMENT_ERROR = 1e-9;
const FUNCTION_RE = /^\\(arcsin|arccos|arctan|sinh|cosh|tanh|sin|cos|tan|cot|sec|csc|ln|exp|log)(?![a-zA-Z])/;

/** Gives each variable its value at the current point, or undefined when variables are not allowed. */
export type Assignment = (name: string) => Num | undefined;

class Parser {
  private pos = 0;
  private depth = 0;
  hasPercent = false;
  hasDecimal = false;
  readonly variables = new Set<string>();

  constructor(
    private readonly s: string,
    private readonly percent: PercentMode,
    private readonly assign: Assignment,
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

  private rest(n = 64): string {
    return this.s.slice(this.pos, this.pos + n);
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
      else if (this.eat('/') || this.eat('\\div')) left = divide(left, this.unary());
      else if (this.startsImplicitFactor()) left = mul(left, this.power());
      else break;
    }
    return left;
  }

  /** A factor that may follow another without an operator: "2\sqrt{3}", "3(4)", "2x", "xy", "2\sin x". Never a digit. */
  private startsImplicitFactor(): boolean {
    const c = this.peek();
    if (c === '(' || c === '{' || /[a-zA-Z]/.test(c)) return true;
    if (c !== '\\') return false;
    const rest = this.rest();
    return /^\\(?:frac|sqrt|pi|binom)(?![a-zA-Z])/.test(rest) || GREEK_RE.test(rest) || FUNCTION_RE.test(rest);
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
    return pow(base, exponent) ?? undefinedHere();
  }

  private postfix(): Num {
    let value = this.primary();
    for (;;) {
      if (this.eat('%')) {
        this.hasPercent = true;
        if (this.percent === 'scale') value = mul(value, ONE_HUNDREDTH);
      } else if (this.eat('!')) value = factorial(value);
      else return value;
    }
  }

  private primary(): Num {
    const c = this.peek();
    if (c === '(') return this.group('(', ')');
    if (c === '{') return this.group('{', '}');
    if (c === '|') return this.absolute();
    if (/[0-9.]/.test(c)) return this.numberWithMixedFraction();
    if (this.eat('\\frac')) return this.fraction();
    if (this.eat('\\binom')) return binomial(this.latexArgument(), this.latexArgument());
    if (this.eat('\\sqrt')) return this.sqrt();
    if (this.eat('\\pi')) return real(Math.PI);
    const fn = FUNCTION_RE.exec(this.rest());
    if (fn) {
      this.pos += fn[0].length;
      return this.functionCall(fn[1]!);
    }
    return this.variable();
  }

  /** e is Euler's number (as math-verify reads it); any other letter or Greek command is a variable. */
  private variable(): Num {
    this.ws();
    const greek = GREEK_RE.exec(this.rest());
    let name: string;
    if (greek) name = greek[0];
    else if (/[a-zA-Z]/.test(this.s[this.pos] ?? '')) name = this.s[this.pos]!;
    else return fail();
    this.pos += name.length;
    const sub = /^_(?:\{\s*([a-zA-Z0-9]{1,4})\s*\}|([a-zA-Z0-9]))/.exec(this.rest());
    if (sub) {
      this.pos += sub[0].length;
      name = `${name}_${sub[1] ?? sub[2]!}`;
    }
    if (name === 'e') return real(Math.E);
    this.variables.add(name);
    return this.assign(name) ?? fail();
  }

  private absolute(): Num {
    this.enter();
    this.eat('|');
    const value = this.expr();
    if (!this.eat('|')) fail();
    this.depth--;
    return absolute(value);
  }

  /** \sin x, \sin(x), \sin^2 x (= (\sin x)^2), \log_2 8, \log x (base 10, the school convention). */
  private functionCall(name: string): Num {
    let base: Num | undefined;
    if (name === 'log' && this.eat('_')) base = this.peek() === '{' ? this.group('{', '}') : this.numberOrPrimaryArgument();
    let exponent: Num | undefined;
    if (this.eat('^')) exponent = this.peek() === '{' ? this.group('{', '}') : this.numberOrPrimaryArgument();
    const c = this.peek();
    const arg = c === '(' ? this.group('(', ')') : c === '{' ? this.group('{', '}') : this.power();
    let value: Num;
    if (name === 'log') {
      // log_b x = ln x / ln b, each with its error; a base of 1 (ln b = 0) is undefined.
      const ln = (a: Num): Num => applyFunction('ln', a);
      value = divide(ln(arg), ln(base ?? rational(10n)));
      if (!value.exact) value = exactIfInteger(value.x, value.err);
    } else value = applyFunction(name, arg);
    return exponent === undefined ? value : (pow(value, exponent) ?? undefinedHere());
  }

  private numberOrPrimaryArgument(): Num {
    const c = this.peek();
    if (/[0-9]/.test(c)) {
      this.pos++;
      return rational(BigInt(c));
    }
    return this.primary();
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
    return divide(numerator, denominator);
  }

  private sqrt(): Num {
    let k = 2;
    if (this.peek() === '[') {
      const index = this.group('[', ']');
      if (!isInteger(index) || index.n < 2n || index.n > 64n) fail();
      k = Number(index.n);
    }
    return root(this.latexArgument(), k) ?? undefinedHere();
  }

  /** A LaTeX macro argument: {group}, (group) for plain-text "\sqrt(2)", one digit as in \frac12, one letter, or \pi. */
  private latexArgument(): Num {
    const c = this.peek();
    if (c === '{') return this.group('{', '}');
    if (c === '(') return this.group('(', ')');
    if (/[0-9]/.test(c)) {
      this.pos++;
      return rational(BigInt(c));
    }
    if (this.eat('\\pi')) return real(Math.PI);
    return this.variable();
  }

  /**
   * A literal. An integer literal followed by \frac of two integer literals is a mixed number when the fraction is
   * proper (2\frac12 = 5/2, as in textbook answers); math-verify reads an improper one the same way (2\frac32 = 7/2).
   */
  private numberWithMixedFraction(): Num {
    const whole = this.number();
    this.ws();
    if (!isInteger(whole) || !MIXED_FRACTION.test(this.rest())) return whole;
    this.eat('\\frac');
    const part = this.fraction();
    return whole.n < 0n ? sub(whole, part) : add(whole, part);
  }

  private number(): Num {
    const m = /^(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?/.exec(this.s.slice(this.pos, this.pos + MAX_EXPRESSION_LENGTH));
    const [text = '', intPart = '', fracPart = '', expPart] = m ?? [];
    if (intPart === '' && fracPart === '') fail();
    if (text.includes('.')) this.hasDecimal = true;
    this.pos += text.length;
    const digits = BigInt(intPart + fracPart);
    const exp = (expPart === undefined ? 0 : Number(expPart)) - fracPart.length;
    if (Math.abs(exp) > 4000) {
      // 1e-5000 is not 0, and 1e5000 is not Infinity: out of the range of doubles, so PrecisionLost (never compared).
      const x = Number(text);
      if (digits === 0n) return rational(0n);
      if (x === 0) throw new PrecisionLost();
      return real(x);
    }
    return exp >= 0 ? rational(digits * 10n ** BigInt(exp)) : rational(digits, 10n ** BigInt(-exp));
  }
}

function divide(a: Num, b: Num): Num {
  return div(a, b) ?? undefinedHere();
}

/** Past this a binomial coefficient is out of the range of doubles (2^1100 > 1.8e308): no value to compare. */
const MAX_BINOMIAL = 2n ** 1100n;

/**
 * C(n, k) for integers 0 ≤ k ≤ n (math-verify evaluates \binom). C(n, i) grows with i up to n/2, so the loop stops as
 * soon as it passes {@link MAX_BINOMIAL} (PrecisionLost): a few products of numbers of ~1100 bits, whatever n and k.
 */
function binomial(n: Num, k: Num): Num {
  if (!isInteger(n) || !isInteger(k) || k.n < 0n || n.n < 0n) return undefinedHere();
  if (k.n > n.n) return rational(0n);
  const m = k.n < n.n - k.n ? k.n : n.n - k.n;
  let r = 1n;
  for (let i = 0n; i < m; i++) {
    r = (r * (n.n - i)) / (i + 1n);
    if (r > MAX_BINOMIAL) throw new PrecisionLost();
  }
  return rational(r);
}

/** n! for integers 0..170 (exact up to 30, where it stays small); anything else is undefined. */
function factorial(a: Num): Num {
  if (!isInteger(a) || a.n < 0n || a.n > 170n) return undefinedHere();
  let r = 1n;
  for (let k = 2n; k <= a.n; k++) r *= k;
  return rational(r);
}

/**
 * sin(0), ln(1), log_2(8): a float within its error of a small integer is kept exact, so 3 = \log_2 8 compares
 * exactly. Not 0 unless computed as exactly 0 from exact input: \sin(\pi) stays a float within its error of 0, so
 * that 10^{20}\sin(\pi) is not an exact 0 (nor \cos(10^{-7}) an exact 1: it is 5e-15 from 1, far more than its error).
 */
function exactIfInteger(y: number, err: number): Num {
  const r = Math.round(y);
  if (y === 0 && err === 0) return rational(0n);
  const integer = r !== 0 && Math.abs(y - r) <= Math.min(4 * err, 1e-12) && Math.abs(r) < 2 ** 52;
  return integer ? rational(BigInt(r)) : real(y, err);
}

/**
 * f(arg) for one of {@link FUNCTIONS}, with its error: the argument's error times the slope's bound over
 * [x − e, x + e], plus the function's own rounding. Undefined where f is (ln 0, arcsin 2, cot 0); PrecisionLost when
 * the argument is too uncertain for the slope to bound anything, or exp, sinh, cosh overflow.
 */
function applyFunction(name: string, arg: Num): Num {
  const { f, slope } = FUNCTIONS[name]!;
  const x = toFloat(arg);
  const e = errorOf(arg);
  const y = f(x);
  if (!Number.isFinite(y)) {
    if (GROWING.has(name) && !Number.isNaN(y)) throw new PrecisionLost();
    undefinedHere();
  }
  if (e > MAX_ARGUMENT_ERROR * Math.max(1, Math.abs(x)) || (name === 'ln' && e >= x / 2)) throw new PrecisionLost();
  // An exact argument has no error to stretch (and the slope may be infinite there: \arcsin 1).
  const steepest = e === 0 ? 0 : Math.max(slope(x), slope(x - e), slope(x + e));
  if (!Number.isFinite(steepest)) throw new PrecisionLost();
  // exp underflows to 0 (or a subnormal) for a nonzero true value: that is a lost value too (real() refuses subnormals).
  if (y === 0 && name === 'exp') throw new PrecisionLost();
  const err = steepest * e * (1 + 1e-6) + Math.abs(y) * 2 ** -51;
  // An error this large means the argument was next to a pole (tan) or huge (sin 10^{10}): the value is unknown.
  if (err > 1e-3 * Math.max(1, Math.abs(y))) throw new PrecisionLost();
  return exactIfInteger(y, err);
}

/**
 * Parses a normalised answer as a number, or returns undefined when it is not (only) arithmetic: a variable, a
 * word, a value undefined (1/0), anything the parser does not read. Never throws; returns undefined for non-finite
 * results and inputs over {@link MAX_EXPRESSION_LENGTH}.
 */
export function parseNumber(text: string, percent: PercentMode = 'scale'): ParsedNumber | undefined {
  const result = evaluateExpression(text, () => undefined, percent);
  if (result.kind !== 'value' || result.variables.size > 0) return undefined;
  return { value: result.value, hasPercent: result.hasPercent, hasDecimal: result.hasDecimal, integerLiteral: /^[+-]?\d+\s*%?$/.test(text.trim()) };
}

export type Evaluated =
  | { kind: 'value'; value: Num; variables: ReadonlySet<string>; hasPercent: boolean; hasDecimal: boolean }
  /** An expression, undefined at this point (a domain error, a division by zero). */
  | { kind: 'undefined'; variables: ReadonlySet<string> }
  /** An expression whose value here leaves the range of doubles (x^{3000}, 10^{-400}): not known well enough to compare. */
  | { kind: 'lost'; variables: ReadonlySet<string> }
  | { kind: 'invalid' };

/**
 * Evaluates an answer with its variables given by `assign` (names as written: x, y_1, \theta). 'invalid' when it is
 * not an expression this parser reads (or uses a variable `assign` has no value for), 'undefined' when it is one but
 * has no finite value at this point. Never throws.
 */
export function evaluateExpression(text: string, assign: Assignment, percent: PercentMode = 'scale'): Evaluated {
  if (text.length === 0 || text.length > MAX_EXPRESSION_LENGTH) return { kind: 'invalid' };
  const parser = new Parser(text, percent, assign);
  try {
    const value = parser.parse();
    if (!value.exact && !Number.isFinite(value.x)) return { kind: 'lost', variables: parser.variables };
    return { kind: 'value', value, variables: parser.variables, hasPercent: parser.hasPercent, hasDecimal: parser.hasDecimal };
  } catch (err) {
    if (err instanceof DomainFailure) return { kind: 'undefined', variables: parser.variables };
    if (err instanceof PrecisionLost) return { kind: 'lost', variables: parser.variables };
    // ParseFailure for text that is not an expression; anything else (a RangeError from BigInt) means the same.
    return { kind: 'invalid' };
  }
}
