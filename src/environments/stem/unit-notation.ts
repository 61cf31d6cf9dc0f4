/**
 * How answers write units, read into plain factors for the unit library (units.ts): TeX (`\mathrm{m\,s^{-2}}`,
 * `^\circ`, `\mu`, `\Omega`), typography (`·`, `⁻²`, `℃`), and the physics texts' convention that a `/` divides by
 * everything after it up to the next product sign (`J/mol K` is J/(mol·K)), which general-purpose parsers such as
 * mathjs read the other way. Which names are units, their prefixes and their conversions are the library's business.
 * Input is untrusted model output: the scan is linear, bounded, and never throws.
 */

/** One factor of a unit expression: a unit name (as written, prefix included) and its integer power. */
export type UnitFactor = readonly [name: string, power: number];

/** Longest unit text read. */
const MAX_UNIT_TEXT = 100;
/** Largest power accepted (|n|). */
const MAX_POWER = 12;

const SUPERSCRIPTS: Record<string, string> = { '⁻': '-', '⁺': '+', '⁰': '0', '¹': '1', '²': '2', '³': '3', '⁴': '4', '⁵': '5', '⁶': '6', '⁷': '7', '⁸': '8', '⁹': '9' };

/** LaTeX and typography that only spell a unit differently. */
export function normalizeUnitText(text: string): string {
  return text
    .replace(/\\(?:mathrm|text|textrm|mathit|operatorname|rm|mbox)\b/g, '')
    .replace(/\\(?:cdot|times)\b/g, '·')
    .replace(/\^\s*\{?\s*\\circ\s*\}?|\\circ\b|º|˚/g, '°')
    .replace(/\\(?:mu|micro)\b\s*|μ/g, 'µ') // a TeX command ends at the space after it: "\mu s" is µs
    .replace(/\\Omega\b|Ω/g, 'Ω')
    .replace(/\\AA\b|Å/g, 'Å')
    .replace(/℃/g, '°C')
    .replace(/℉/g, '°F')
    .replace(/\\[,;:! ]|~/g, ' ')
    .replace(/[{}]/g, '')
    .replace(/[⁻⁺⁰¹²³⁴⁵⁶⁷⁸⁹]+/g, (s) => `^${[...s].map((c) => SUPERSCRIPTS[c]).join('')}`)
    .replace(/\b(?:deg(?:ree)?s?)\s*(?:°\s*)?(C|F|Celsius|Fahrenheit)\b/gi, (_, scale: string) => `°${scale[0]!.toUpperCase()}`)
    .replace(/°\s+([CF])\b/g, '°$1')
    .replace(/\b(?:deg(?:ree)?s?)\s+(K|kelvins?)\b/gi, 'K')
    .replace(/\s+/g, ' ')
    .trim();
}

/**
 * The factors of a unit expression, after {@link normalizeUnitText}: products by space, `*`, `·` or `.`; quotients by
 * `/`, which applies to every factor after it up to the next product sign (`J/mol K` = J mol⁻¹ K⁻¹); powers `^2`,
 * `**2`, `^(-1)` or digits right after a name (`m2`, `m s-1`); parentheses, expanded. Undefined when the text is not
 * such an expression (empty, a dangling `/`, unbalanced parentheses, a power past ±12).
 */
export function unitFactors(text: string): UnitFactor[] | undefined {
  const s = normalizeUnitText(text);
  if (s === '' || s.length > MAX_UNIT_TEXT) return undefined;
  const reader = new NotationReader(s);
  const factors = reader.expression(0);
  return factors && reader.atEnd ? factors : undefined;
}

class NotationReader {
  private pos = 0;

  constructor(private readonly s: string) {}

  get atEnd(): boolean {
    return this.pos === this.s.length;
  }

  /** expression := term (separator term)*, up to the end or a ")" (left for the caller); `depth` bounds nesting. */
  expression(depth: number): UnitFactor[] | undefined {
    if (depth > 5) return undefined;
    const factors: UnitFactor[] = [];
    let sign = 1;
    for (let first = true; ; first = false) {
      this.skipSpaces();
      if (this.atEnd || this.s[this.pos] === ')') return first ? undefined : factors;
      if (!first) {
        const c = this.s[this.pos]!;
        if (c === '/') sign = -1;
        else if (c === '*' || c === '·' || c === '⋅' || c === '.') sign = 1;
        if ('/*·⋅.'.includes(c)) this.pos++;
      }
      const term = this.term(depth);
      if (!term) return undefined;
      for (const [name, power] of term) factors.push([name, power * sign]);
    }
  }

  /** term := (name | "(" expression ")") power? */
  private term(depth: number): UnitFactor[] | undefined {
    this.skipSpaces();
    let inner: UnitFactor[] | undefined;
    if (this.s[this.pos] === '(') {
      this.pos++;
      inner = this.expression(depth + 1);
      if (!inner || this.s[this.pos] !== ')') return undefined;
      this.pos++;
    } else {
      const name = /^(?:°[CF]|[A-Za-zµΩÅ°]+)/.exec(this.s.slice(this.pos))?.[0];
      if (!name) return undefined;
      this.pos += name.length;
      inner = [[name, 1]];
    }
    const power = this.power();
    if (power === undefined) return undefined;
    return inner.map(([name, p]) => [name, p * power] as const);
  }

  /** "^2", "^-1", "**3", "^(-2)", or digits right after the name ("m2", "s-1"); default 1. */
  private power(): number | undefined {
    // A ")" is taken only after a "(" of the power's own: in "(m^3)^-3" the first ")" closes the group.
    const m = /^(?:\s*(?:\^|\*\*)\s*(?:\(\s*([+-]?\d+)\s*\)|([+-]?\d+))|([+-]?\d+))/.exec(this.s.slice(this.pos));
    if (!m) return 1;
    this.pos += m[0].length;
    const power = Number(m[1] ?? m[2] ?? m[3]);
    return Number.isInteger(power) && power !== 0 && Math.abs(power) <= MAX_POWER ? power : undefined;
  }

  private skipSpaces(): void {
    while (this.s[this.pos] === ' ') this.pos++;
  }
}
