import { createRequire } from 'node:module';
import type * as MathJs from 'mathjs';
import { unitFactors } from './unit-notation.js';

/**
 * Units of measure for the STEM environment's numeric answers: parse a unit expression ("km/h", "kg·m/s^2",
 * "J/(mol K)", "\mathrm{m\,s^{-1}}", "°C", "kilometers") and convert values between compatible units.
 *
 * {@link UnitSystem} is the seam; {@link mathjsUnits}, the default, puts mathjs's units behind it (the SI and its
 * prefixes, derived, CGS, imperial and US units, temperature scales with offsets, angles as a dimension of their own),
 * with the notation of answers read by unit-notation.ts and a few units textbooks use that mathjs lacks added here.
 */

/** A unit a {@link UnitSystem} understood; only the system that parsed it can convert with it. */
export interface Unit {
  /** The unit in the system's own notation (e.g. "J mol^-1 K^-1"), for reports and logs. */
  readonly text: string;
}

export interface UnitSystem {
  /** The unit `text` denotes, or undefined when it is not understood (never throws). */
  parse(text: string): Unit | undefined;
  /** `value` in `from` expressed in `to`; undefined when their dimensions differ (never throws). */
  convert(value: number, from: Unit, to: Unit): number | undefined;
}

/**
 * Units textbooks and datasets use that mathjs 15 does not define (or not under these names), and two it defines
 * with rounded or superseded values: the torr (exactly 101325/760 Pa, mathjs 133.322) and the electronvolt (exactly
 * 1.602176634e-19 J since 2019, mathjs CODATA 2010's), which an exact answer (tolerance 0) would otherwise miss.
 * Values: CODATA 2018 (u), IAU 2012 (au), IAU 2015 (pc), the Julian year (ly, yr).
 */
const EXTRA_UNITS: Record<string, MathJs.UnitDefinition> = {
  torr: { definition: `${101325 / 760} Pa`, prefixes: 'short', aliases: ['Torr'] },
  eV: { definition: '1.602176634e-19 J', prefixes: 'short', aliases: ['electronvolt', 'electronvolts'] },
  d: { definition: '1 day' },
  yr: { definition: '365.25 day', prefixes: 'short' },
  au: { definition: '1.495978707e11 m', aliases: ['AU'] },
  ly: { definition: '9.4607304725808e15 m', aliases: ['lightyear', 'lightyears'] },
  pc: { definition: '3.0856775814913673e16 m', prefixes: 'short', aliases: ['parsec', 'parsecs'] },
  u: { definition: '1.66053906660e-27 kg', aliases: ['amu'] },
  Da: { definition: '1.66053906660e-27 kg', prefixes: 'short', aliases: ['dalton', 'daltons'] },
  M: { definition: '1 mol/L', prefixes: 'short' },
  Bq: { definition: '1 Hz', prefixes: 'short' },
  Gy: { definition: '1 J/kg', prefixes: 'short' },
  sr: { definition: '1 rad^2' },
  cal: { definition: '4.184 J', prefixes: 'short', aliases: ['calorie', 'calories'] },
  mph: { definition: '1 mi/h' },
  kph: { definition: '1 km/h' },
};

/** Spellings answers use for units mathjs knows by another name. */
const ALIASES: Record<string, string> = {
  '°': 'deg',
  '°C': 'degC',
  '°F': 'degF',
  Å: 'angstrom',
  pound: 'lb',
  pounds: 'lb',
  atmosphere: 'atm',
  atmospheres: 'atm',
};

let math: MathJs.MathJsInstance | undefined;

/**
 * mathjs, created on first use with only its unit functions. Loaded lazily (a synchronous require of its CommonJS
 * build) because importing it costs 0.5–1 s (some 1,500 modules), which a server that never reads a STEM unit
 * should not pay at start-up. A private instance, so the units added here never leak into other users of mathjs.
 */
function mathjs(): MathJs.MathJsInstance {
  if (!math) {
    const { create, unitDependencies, createUnitDependencies } = createRequire(import.meta.url)('mathjs') as typeof MathJs;
    math = create({ unitDependencies, createUnitDependencies });
    math.createUnit(EXTRA_UNITS, { override: true });
  }
  return math;
}

/**
 * The mathjs name of a unit as an answer writes it, or undefined when mathjs knows it under no spelling tried: as
 * written (MeV, ms, Pa), then without a plural s ("newtons", "hrs", "lbs"), then in lower case for spelled-out names
 * (only past three letters: lower-casing "MeV" would make it milli-eV).
 */
function mathjsName(written: string): string | undefined {
  const name = written.replace(/µ/g, 'u').replace(/Ω/g, 'ohm');
  const singular = name.length > 2 && name.endsWith('s') ? name.slice(0, -1) : name;
  const candidates = name.length > 3 ? [written, name, singular, name.toLowerCase(), singular.toLowerCase()] : [written, name, singular];
  for (const candidate of candidates) {
    const alias = ALIASES[candidate];
    if (alias !== undefined) return alias;
    if (/^[A-Za-z]+$/.test(candidate) && mathjs().Unit.isValuelessUnit(candidate)) return candidate;
  }
  return undefined;
}

class MathjsUnit implements Unit {
  constructor(
    readonly text: string,
    readonly unit: MathJs.Unit,
  ) {}
}

/**
 * The default unit system: mathjs's units (with SI prefixes where mathjs allows them, spelled-out names and plurals)
 * plus {@link EXTRA_UNITS}, read through unit-notation.ts. Compatibility is mathjs's `equalBase` (same dimensions;
 * angles are a dimension of their own, so `30°` is never the plain number 30), conversion its `toNumber`. °C and °F
 * count only alone: an affine scale inside a product or power ("°C/s") has no single meaning, so it is refused.
 */
export const mathjsUnits: UnitSystem = {
  parse(text: string): Unit | undefined {
    const factors = unitFactors(text);
    if (!factors) return undefined;
    const names = factors.map(([written]) => mathjsName(written));
    if (names.some((n) => n === undefined)) return undefined;
    const expression = factors.map(([, power], i) => (power === 1 ? names[i]! : `${names[i]!}^${power}`)).join(' ');
    try {
      const unit = mathjs().unit(expression);
      const affine = unit.units.some((u) => u.unit.offset !== 0);
      if ((unit.value as number | null) !== null || (affine && (unit.units.length !== 1 || unit.units[0]!.power !== 1))) return undefined;
      return new MathjsUnit(expression, unit);
    } catch {
      return undefined;
    }
  },

  convert(value: number, from: Unit, to: Unit): number | undefined {
    if (!(from instanceof MathjsUnit) || !(to instanceof MathjsUnit) || !from.unit.equalBase(to.unit)) return undefined;
    try {
      const converted = mathjs().unit(value, from.text).toNumber(to.text);
      return Number.isFinite(converted) ? converted : undefined;
    } catch {
      return undefined;
    }
  },
};
