/**
 * Units of measure for the STEM environment's numeric answers: parse a unit expression ("km/h", "kg·m/s^2",
 * "J/(mol K)", "\mathrm{m\,s^{-1}}", "°C", "kilometers") and convert between compatible units.
 *
 * {@link UnitSystem} is the seam: {@link builtinUnits} is a small table of SI, common derived, and customary
 * units (with SI prefixes) that covers textbook answers; a full library (mathjs's `unit`, js-quantities) can be
 * put behind the same interface without touching the environment.
 */

/** A parsed unit: a value `x` in it is `(x + offset) * factor` in SI base units of dimension `dimension`. */
export interface Unit {
  /** Canonical text of the dimension: exponents of m, kg, s, A, K, mol, cd, rad (e.g. "1,0,-2,0,0,0,0,0"). */
  dimension: string;
  factor: number;
  /** Non-zero only for affine temperature scales (°C, °F), which may not be combined with other units. */
  offset: number;
}

export interface UnitSystem {
  /** The unit `text` denotes, or undefined when it is not understood (never throws). */
  parse(text: string): Unit | undefined;
}

/** `value` in `from` expressed in `to`; undefined when the dimensions differ. */
export function convertUnit(value: number, from: Unit, to: Unit): number | undefined {
  if (from.dimension !== to.dimension) return undefined;
  return ((value + from.offset) * from.factor) / to.factor - to.offset;
}

/** Base dimensions, in the order of `Unit.dimension`; angles get their own so degrees never equal plain numbers. */
const BASE = ['m', 'kg', 's', 'A', 'K', 'mol', 'cd', 'rad'] as const;
type Dim = number[];
type Entry = readonly [factor: number, dim: Partial<Record<(typeof BASE)[number], number>>, prefixable: boolean, offset?: number];

const J = { m: 2, kg: 1, s: -2 };
const PA = { m: -1, kg: 1, s: -2 };
const EV = 1.602176634e-19;

/** Symbols, with whether SI prefixes apply. */
const SYMBOLS: Record<string, Entry> = {
  m: [1, { m: 1 }, true],
  g: [1e-3, { kg: 1 }, true],
  s: [1, { s: 1 }, true],
  A: [1, { A: 1 }, true],
  K: [1, { K: 1 }, true],
  mol: [1, { mol: 1 }, true],
  cd: [1, { cd: 1 }, true],
  rad: [1, { rad: 1 }, true],
  sr: [1, { rad: 2 }, false],
  deg: [Math.PI / 180, { rad: 1 }, false],
  '°': [Math.PI / 180, { rad: 1 }, false],
  arcmin: [Math.PI / 10800, { rad: 1 }, false],
  arcsec: [Math.PI / 648000, { rad: 1 }, false],
  '°C': [1, { K: 1 }, false, 273.15],
  '°F': [5 / 9, { K: 1 }, false, 459.67],
  N: [1, { m: 1, kg: 1, s: -2 }, true],
  J: [1, J, true],
  W: [1, { m: 2, kg: 1, s: -3 }, true],
  Pa: [1, PA, true],
  Hz: [1, { s: -1 }, true],
  C: [1, { s: 1, A: 1 }, true],
  V: [1, { m: 2, kg: 1, s: -3, A: -1 }, true],
  Ω: [1, { m: 2, kg: 1, s: -3, A: -2 }, true],
  S: [1, { m: -2, kg: -1, s: 3, A: 2 }, true],
  F: [1, { m: -2, kg: -1, s: 4, A: 2 }, true],
  H: [1, { m: 2, kg: 1, s: -2, A: -2 }, true],
  T: [1, { kg: 1, s: -2, A: -1 }, true],
  Wb: [1, { m: 2, kg: 1, s: -2, A: -1 }, true],
  Bq: [1, { s: -1 }, true],
  Gy: [1, { m: 2, s: -2 }, true],
  L: [1e-3, { m: 3 }, true],
  l: [1e-3, { m: 3 }, true],
  M: [1e3, { mol: 1, m: -3 }, true],
  eV: [EV, J, true],
  cal: [4.184, J, true],
  Wh: [3600, J, true],
  erg: [1e-7, J, false],
  dyn: [1e-5, { m: 1, kg: 1, s: -2 }, false],
  atm: [101325, PA, false],
  bar: [1e5, PA, true],
  Torr: [101325 / 760, PA, false],
  torr: [101325 / 760, PA, false],
  mmHg: [133.322387415, PA, false],
  psi: [6894.757293168361, PA, false],
  min: [60, { s: 1 }, false],
  h: [3600, { s: 1 }, false],
  hr: [3600, { s: 1 }, false],
  d: [86400, { s: 1 }, false],
  day: [86400, { s: 1 }, false],
  yr: [365.25 * 86400, { s: 1 }, false],
  Å: [1e-10, { m: 1 }, false],
  in: [0.0254, { m: 1 }, false],
  ft: [0.3048, { m: 1 }, false],
  yd: [0.9144, { m: 1 }, false],
  mi: [1609.344, { m: 1 }, false],
  au: [1.495978707e11, { m: 1 }, false],
  AU: [1.495978707e11, { m: 1 }, false],
  ly: [9.4607304725808e15, { m: 1 }, false],
  pc: [3.0856775814913673e16, { m: 1 }, true],
  t: [1e3, { kg: 1 }, false],
  u: [1.6605390666e-27, { kg: 1 }, false],
  amu: [1.6605390666e-27, { kg: 1 }, false],
  Da: [1.6605390666e-27, { kg: 1 }, true],
  lb: [0.45359237, { kg: 1 }, false],
  oz: [0.028349523125, { kg: 1 }, false],
  mph: [0.44704, { m: 1, s: -1 }, false],
  kph: [1 / 3.6, { m: 1, s: -1 }, false],
};

const PREFIXES: Record<string, number> = {
  Y: 1e24, Z: 1e21, E: 1e18, P: 1e15, T: 1e12, G: 1e9, M: 1e6, k: 1e3, h: 1e2, da: 1e1,
  d: 1e-1, c: 1e-2, m: 1e-3, µ: 1e-6, u: 1e-6, n: 1e-9, p: 1e-12, f: 1e-15, a: 1e-18,
};

/** Spelled-out names (singular; a trailing "s" is accepted), mapped to symbols. */
const WORDS: Record<string, string> = {
  meter: 'm', metre: 'm', gram: 'g', second: 's', sec: 's', ampere: 'A', amp: 'A', kelvin: 'K', mole: 'mol',
  candela: 'cd', radian: 'rad', degree: 'deg', newton: 'N', joule: 'J', watt: 'W', pascal: 'Pa', hertz: 'Hz',
  coulomb: 'C', volt: 'V', ohm: 'Ω', siemens: 'S', farad: 'F', henry: 'H', tesla: 'T', weber: 'Wb', liter: 'L',
  litre: 'L', electronvolt: 'eV', calorie: 'cal', atmosphere: 'atm', minute: 'min', hour: 'h', day: 'd',
  year: 'yr', angstrom: 'Å', inch: 'in', inche: 'in', foot: 'ft', feet: 'ft', yard: 'yd', mile: 'mi', pound: 'lb',
  ounce: 'oz', tonne: 't', celsius: '°C', fahrenheit: '°F',
};
const WORD_PREFIXES: Record<string, string> = {
  yotta: 'Y', zetta: 'Z', exa: 'E', peta: 'P', tera: 'T', giga: 'G', mega: 'M', kilo: 'k', hecto: 'h', deca: 'da',
  deci: 'd', centi: 'c', milli: 'm', micro: 'µ', nano: 'n', pico: 'p', femto: 'f', atto: 'a',
};

const SUPERSCRIPTS: Record<string, string> = { '⁻': '-', '⁺': '+', '⁰': '0', '¹': '1', '²': '2', '³': '3', '⁴': '4', '⁵': '5', '⁶': '6', '⁷': '7', '⁸': '8', '⁹': '9' };

/** LaTeX and typography that only spell a unit differently. */
export function normalizeUnitText(text: string): string {
  return text
    .replace(/\\(?:mathrm|text|textrm|mathit|operatorname|rm|mbox)\b/g, '')
    .replace(/\\(?:cdot|times)\b/g, '·')
    .replace(/\^\s*\{?\s*\\circ\s*\}?|\\circ\b|º|˚/g, '°')
    .replace(/\\(?:mu|micro)\b|μ/g, 'µ')
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

function dimOf(entry: Entry): Dim {
  return BASE.map((b) => entry[1][b] ?? 0);
}

/** One name: a symbol, a prefixed symbol, or a (prefixed) spelled-out name. */
function lookup(name: string): { factor: number; dim: Dim; offset: number } | undefined {
  const direct = SYMBOLS[name];
  if (direct) return { factor: direct[0], dim: dimOf(direct), offset: direct[3] ?? 0 };
  for (const [prefix, scale] of Object.entries(PREFIXES)) {
    if (!name.startsWith(prefix) || name.length === prefix.length) continue;
    const entry = SYMBOLS[name.slice(prefix.length)];
    if (entry?.[2]) return { factor: entry[0] * scale, dim: dimOf(entry), offset: 0 };
  }
  const word = name.toLowerCase();
  for (const singular of [word, word.replace(/s$/, '')]) {
    for (const [prefix, symbol] of [['', ''], ...Object.entries(WORD_PREFIXES)] as const) {
      if (!singular.startsWith(prefix)) continue;
      const base = WORDS[singular.slice(prefix.length)];
      if (base === undefined) continue;
      const found = lookup(symbol + base);
      if (found) return found;
    }
  }
  return undefined;
}

class UnitParser {
  private pos = 0;
  private terms = 0;
  offset = 0;

  constructor(private readonly s: string) {}

  /** expr := factor (sep factor)*; "/" puts the factors after it in the denominator until a "*" or "·". */
  parse(): { factor: number; dim: Dim } | undefined {
    const result = this.expr();
    return result && this.pos === this.s.length ? result : undefined;
  }

  private expr(): { factor: number; dim: Dim } | undefined {
    let factor = 1;
    const dim: Dim = BASE.map(() => 0);
    let sign = 1;
    let first = true;
    for (;;) {
      this.skipSpaces();
      if (this.pos >= this.s.length || this.s[this.pos] === ')') return first ? undefined : { factor, dim };
      if (!first) {
        const c = this.s[this.pos]!;
        if (c === '/') {
          sign = -1;
          this.pos++;
        } else if (c === '*' || c === '·' || c === '⋅' || c === '.') {
          sign = 1;
          this.pos++;
        }
      }
      const term = this.factor();
      if (!term) return undefined;
      factor *= term.factor ** sign;
      term.dim.forEach((d, i) => (dim[i]! += d * sign));
      first = false;
    }
  }

  private factor(): { factor: number; dim: Dim } | undefined {
    this.skipSpaces();
    let atom: { factor: number; dim: Dim; offset: number } | undefined;
    if (this.s[this.pos] === '(') {
      this.pos++;
      const inner = this.expr();
      if (!inner || this.s[this.pos] !== ')') return undefined;
      this.pos++;
      atom = { ...inner, offset: 0 };
    } else {
      const m = /^(?:°[CF]|[A-Za-zµΩÅ°]+)/.exec(this.s.slice(this.pos));
      if (!m) return undefined;
      this.pos += m[0].length;
      atom = lookup(m[0]);
      if (!atom) return undefined;
    }
    this.terms++;
    const power = this.power();
    if (power === undefined) return undefined;
    if (atom.offset !== 0) {
      if (power !== 1) return undefined;
      this.offset = atom.offset;
    }
    return { factor: atom.factor ** power, dim: atom.dim.map((d) => d * power) };
  }

  /** "^2", "^-1", "**3", "^(-2)", or digits right after the name ("m2", "s-1", as in "m s-1"); default 1. */
  private power(): number | undefined {
    const m = /^(?:\s*(?:\^|\*\*)\s*\(?\s*([+-]?\d+)\s*\)?|([+-]?\d+))/.exec(this.s.slice(this.pos));
    if (!m) return 1;
    this.pos += m[0].length;
    const power = Number(m[1] ?? m[2]);
    return Number.isInteger(power) && Math.abs(power) <= 12 ? power : undefined;
  }

  private skipSpaces(): void {
    while (this.s[this.pos] === ' ') this.pos++;
  }

  get single(): boolean {
    return this.terms === 1;
  }
}

/**
 * The built-in unit table: the SI base and derived units with all SI prefixes (km, µs, kJ, MeV, mL, mM, GPa),
 * degrees and radians (their own dimension), °C and °F (alone only: an affine scale has no meaning inside a
 * product), common non-SI units (min, h, day, yr, Å, in, ft, mi, au, ly, pc, lb, oz, t, u, atm, bar, Torr, mmHg,
 * psi, cal, Wh, eV, erg, dyn, mph), and spelled-out names with plural s ("kilometers", "joules").
 * Products by space, "*", "·" or "."; quotients by "/" (which applies to everything after it up to the next
 * product sign: "J/mol K" is J/(mol·K), as physics texts write it); powers by "^2", "**2", "²" or a trailing
 * "-1" as in "m s-1"; parentheses.
 */
export const builtinUnits: UnitSystem = {
  parse(text: string): Unit | undefined {
    const s = normalizeUnitText(text);
    if (s === '' || s.length > 100) return undefined;
    const parser = new UnitParser(s);
    const parsed = parser.parse();
    if (!parsed || !Number.isFinite(parsed.factor) || parsed.factor === 0) return undefined;
    if (parser.offset !== 0 && !parser.single) return undefined;
    return { dimension: parsed.dim.join(','), factor: parsed.factor, offset: parser.offset };
  },
};
