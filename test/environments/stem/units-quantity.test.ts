import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { compareQuantity, parseQuantity, type NumericReference } from '../../../src/environments/stem/quantity.js';
import { unitFactors } from '../../../src/environments/stem/unit-notation.js';
import { mathjsUnits } from '../../../src/environments/stem/units.js';

const unit = (text: string) => {
  const u = mathjsUnits.parse(text);
  if (!u) throw new Error(`unit not understood: ${text}`);
  return u;
};
const convert = (value: number, from: string, to: string) => mathjsUnits.convert(value, unit(from), unit(to));
/** |a − b| within `relative` of |b| (unit factors such as 0.0254 are not exact in binary). */
const near = (a: number | undefined, b: number, relative = 1e-9) => a !== undefined && Math.abs(a - b) <= relative * Math.max(Math.abs(b), 1e-300);
/** Two spellings of one unit: converting 1 of the first gives 1 of the second. */
const same = (a: string, b: string) => near(convert(1, a, b), 1);

describe('units (mathjs behind the UnitSystem seam)', () => {
  it('converts between compatible units, prefixes and spellings included', () => {
    expect(convert(36, 'km/h', 'm/s')).toBeCloseTo(10, 12);
    expect(convert(1, 'kWh', 'MJ')).toBeCloseTo(3.6, 12);
    expect(convert(100, '°C', '°F')).toBeCloseTo(212, 9);
    expect(convert(0, 'degrees Celsius', 'K')).toBeCloseTo(273.15, 9);
    expect(convert(1, 'atm', 'kPa')).toBeCloseTo(101.325, 9);
    expect(convert(1, 'g/cm^3', 'kg/m^3')).toBeCloseTo(1000, 9);
    expect(convert(2, 'kilometers', 'm')).toBe(2000);
    expect(convert(1, 'MeV', 'J')).toBeCloseTo(1.602176634e-13, 25); // the exact SI value, not mathjs's CODATA 2010 one
    expect(convert(760, 'Torr', 'atm')).toBeCloseTo(1, 14); // exactly 101325/760 Pa, not mathjs's 133.322
    expect(convert(180, 'deg', 'rad')).toBeCloseTo(Math.PI, 12);
    expect(convert(5, 'mL', 'L')).toBeCloseTo(0.005, 12);
    // Units mathjs lacks, added for textbooks: astronomy, chemistry, radiation, time.
    expect(convert(1, 'Mpc', 'ly')).toBeCloseTo(3.2616e6, -2);
    expect(convert(1, 'kcal', 'J')).toBeCloseTo(4184, 9);
    expect(convert(2, 'mM', 'mol/m^3')).toBeCloseTo(2, 12);
    expect(convert(1, 'kDa', 'u')).toBeCloseTo(1000, 9);
    expect(convert(1, 'keV', 'electronvolts')).toBeCloseTo(1000, 9);
    expect(convert(3, 'd', 'h')).toBeCloseTo(72, 12);
    expect(convert(1, 'Gyr', 'yr')).toBeCloseTo(1e9, 3);
    expect(convert(60, 'mph', 'km/h')).toBeCloseTo(96.56064, 9);
  });

  it('reads products, quotients, powers, TeX, symbols and spelled-out names alike', () => {
    for (const text of ['N', 'kg m s^-2', 'kg*m/s**2', 'kg m s-2', 'kg·m·s⁻²', '\\mathrm{kg\\,m\\,s^{-2}}', 'newtons', 'Newtons', 'kg m/s/s', '(kg m)/s^2']) expect(same(text, 'kg·m/s^2'), text).toBe(true);
    expect(same('J/mol K', 'J/(mol·K)')).toBe(true); // the physics texts' reading of "/"
    expect(same('J/mol K', 'J mol^-1 K^-1')).toBe(true);
    expect(same('W/m^2 K', 'W m^-2 K^-1')).toBe(true);
    for (const [a, b] of [['µs', 'us'], ['\\mu s', 'us'], ['kΩ', 'kohm'], ['\\Omega', 'ohm'], ['Å', 'angstrom'], ['\\AA', 'angstrom'], ['hrs', 'h'], ['lbs', 'lb'], ['Torr', 'torr'], ['℃', '°C'], ['^\\circ', 'deg']]) {
      expect(same(a, b), `${a} = ${b}`).toBe(true);
    }
    expect(convert(1, 'Å', 'm')).toBeCloseTo(1e-10, 20);
  });

  it('refuses what it does not know, mixed dimensions, and affine scales inside products', () => {
    for (const text of ['furlong', 'm/', '°C/s', '°C^2', '', 'xyzzy', 'm^0', 'm^13', '(m', 'apples', 'cm of rain']) expect(mathjsUnits.parse(text), text).toBeUndefined();
    expect(convert(1, 'm', 's')).toBeUndefined();
    expect(convert(1, 'J', 'N')).toBeUndefined();
  });

  it('never takes an angle for a plain number, whatever the angle unit (property)', () => {
    fc.assert(
      fc.property(fc.constantFrom('deg', '°', 'degrees', 'rad', 'arcmin', 'arcsec', '^\\circ'), fc.constantFrom('m/m', 's/s', 'kg/g', 'J/(N m)'), fc.double({ min: -1e6, max: 1e6, noNaN: true }), (angle, plain, x) => {
        expect(convert(x, angle, plain)).toBeUndefined();
        expect(convert(x, plain, angle)).toBeUndefined();
        expect(convert(x, angle, 'rad')).toBeDefined();
      }),
    );
  });

  it('round-trips any value through any pair of compatible units (property)', () => {
    const families = [
      ['m', 'km', 'ft', 'in', 'mi', 'Å', 'au', 'ly', 'pc', 'nm'],
      ['J', 'kJ', 'eV', 'MeV', 'cal', 'kcal', 'kWh', 'erg'],
      ['Pa', 'kPa', 'atm', 'bar', 'Torr', 'psi', 'mmHg'],
      ['K', '°C', '°F'],
      ['m/s', 'km/h', 'mph', 'ft/s'],
      ['J/(mol K)', 'kJ mol^-1 K^-1', 'cal/mol K'],
    ];
    fc.assert(
      fc.property(fc.constantFrom(...families), fc.nat(), fc.nat(), fc.double({ min: -1e6, max: 1e6, noNaN: true }), (family, i, j, x) => {
        const [a, b] = [family[i % family.length]!, family[j % family.length]!];
        const back = convert(convert(x, a, b)!, b, a)!;
        expect(Math.abs(back - x)).toBeLessThanOrEqual(1e-9 * Math.max(1, Math.abs(x)));
      }),
    );
  });

  it('scales by the prefix: x in (prefix)(unit) is x·10^k in (unit), for every SI prefix mathjs allows on it (property)', () => {
    const prefixes = { G: 9, M: 6, k: 3, h: 2, da: 1, d: -1, c: -2, m: -3, u: -6, µ: -6, n: -9, p: -12 } as const;
    const bases = ['m', 'g', 's', 'J', 'Pa', 'eV', 'L', 'W', 'Hz', 'N', 'V', 'A', 'mol', 'M', 'cal', 'Bq', 'Gy', 'Da'];
    fc.assert(
      fc.property(fc.constantFrom(...(Object.keys(prefixes) as (keyof typeof prefixes)[])), fc.constantFrom(...bases), fc.double({ min: 1e-6, max: 1e6, noNaN: true }), fc.boolean(), (prefix, base, magnitude, negative) => {
        const x = negative ? -magnitude : magnitude;
        expect(near(convert(x, `${prefix}${base}`, base), x * 10 ** prefixes[prefix], 1e-12), `${prefix}${base}`).toBe(true);
      }),
    );
  });

  it('converts a compound unit as the product of its factors\' conversions, however the product is written (property)', () => {
    // Pairs of compatible, non-affine units, with a conversion factor of their own.
    const pairs = [['km', 'm'], ['h', 's'], ['g', 'kg'], ['kJ', 'J'], ['mol', 'mmol'], ['atm', 'Pa'], ['ft', 'in'], ['eV', 'J'], ['L', 'm^3'], ['deg', 'rad']] as const;
    const factor = fc.record({ pair: fc.constantFrom(...pairs), power: fc.constantFrom(-3, -2, -1, 1, 2, 3) });
    fc.assert(
      fc.property(fc.array(factor, { minLength: 1, maxLength: 4 }), fc.double({ min: 1e-3, max: 1e3, noNaN: true }), (factors, x) => {
        const write = (side: 0 | 1, style: 'powers' | 'quotient') => {
          const part = (f: (typeof factors)[number], power: number) => (power === 1 ? f.pair[side] : `(${f.pair[side]})^${power}`);
          if (style === 'powers') return factors.map((f) => part(f, f.power)).join(' ');
          // Numerator · denominator, "/" applying to every factor after it (the physics texts' reading).
          const up = factors.filter((f) => f.power > 0).map((f) => part(f, f.power));
          const down = factors.filter((f) => f.power < 0).map((f) => part(f, -f.power));
          return `${up.length > 0 ? up.join(' ') : '(' + factors[0]!.pair[side] + '/' + factors[0]!.pair[side] + ')'}${down.length > 0 ? ` / ${down.join(' ')}` : ''}`;
        };
        const expected = factors.reduce((product, f) => product * convert(1, f.pair[0], f.pair[1])! ** f.power, x);
        for (const style of ['powers', 'quotient'] as const) {
          expect(near(convert(x, write(0, style), write(1, style)), expected, 1e-9), `${write(0, style)} → ${write(1, style)}`).toBe(true);
        }
      }),
    );
  });

  it('reads notation into plain factors, and never throws on junk (property)', () => {
    expect(unitFactors('J/mol K')).toEqual([['J', 1], ['mol', -1], ['K', -1]]);
    expect(unitFactors('kg·m/(s^2 A)')).toEqual([['kg', 1], ['m', 1], ['s', -2], ['A', -1]]);
    expect(unitFactors('\\mathrm{m\\,s^{-1}}')).toEqual([['m', 1], ['s', -1]]);
    fc.assert(fc.property(fc.string({ maxLength: 120 }), (s) => void mathjsUnits.parse(s)));
  });
});

describe('reading a numeric answer', () => {
  it.each([
    ['9.8 m/s^2', 9.8, 'm/s^2'],
    ['-1.2e-3 kg', -0.0012, 'kg'],
    ['3.0 × 10^{8}\\,\\mathrm{m/s}', 3e8, 'm/s'],
    ['$1.5\\times10^{-3}$ mol', 0.0015, 'mol'],
    ['2.5×10⁻³ m', 0.0025, 'm'],
    ['1,200 J', 1200, 'J'],
    ['12\\,345 m', 12345, 'm'],
    ['v = 3/4', 0.75, ''],
    ['\\boxed{\\frac{1}{2}}', 0.5, ''],
    ['approximately 5 km.', 5, 'km'],
    ['−4 °C', -4, '°C'],
  ])('%s', (text, value, unitText) => {
    const q = parseQuantity(text)!;
    expect(q.value).toBeCloseTo(value, 12);
    // The unit is kept as written (TeX included); the unit system reads it.
    if (unitText === '') expect(q.unitText).toBe('');
    else expect(same(q.unitText, unitText)).toBe(true);
  });

  it('keeps the percent sign apart, and finds no number in words', () => {
    expect(parseQuantity('45%')).toEqual({ value: 45, percent: true, unitText: '' });
    expect(parseQuantity('about forty')).toBeUndefined();
    expect(parseQuantity('x'.repeat(10_000))).toBeUndefined();
  });

  it('reads back any number written in plain, scientific, thousands-separated or ×10^n form (property)', () => {
    fc.assert(
      fc.property(fc.double({ min: 1e-12, max: 1e12, noNaN: true }), fc.boolean(), (x, negative) => {
        const v = negative ? -x : x;
        const [m, e] = v.toExponential(6).split('e');
        const forms = [String(v), v.toExponential(6), `${m} × 10^{${Number(e)}}`, `${m}*10**${Number(e)} m`, Math.abs(v) >= 1000 ? v.toLocaleString('en-US', { maximumFractionDigits: 6 }) : String(v)];
        for (const form of forms) {
          const q = parseQuantity(form);
          expect(q, form).toBeDefined();
          expect(Math.abs(q!.value - v), form).toBeLessThanOrEqual(1e-6 * Math.abs(v));
        }
      }),
    );
  });
});

describe('comparing with a reference under a relative tolerance', () => {
  const ref = (value: number, unitText = '', tolerance = 0.01, percent = false): NumericReference => ({ value, unitText, unit: mathjsUnits.parse(unitText), tolerance, percent });
  const check = (answer: string, r: NumericReference) => compareQuantity(answer, r, mathjsUnits);

  it('converts compatible units, refuses incompatible ones, and takes a bare number in the reference unit', () => {
    expect(check('5 km', ref(5000, 'm'))).toMatchObject({ correct: true, converted: 5000, unitConverted: true });
    expect(check('5000', ref(5000, 'm'))).toMatchObject({ correct: true, unitConverted: false });
    expect(check('5 s', ref(5000, 'm'))).toEqual({ correct: false, reason: 'unit_mismatch' });
    expect(check('212 °F', ref(100, '°C'))).toMatchObject({ correct: true });
    expect(check('5 furlongs', ref(5, 'm'))).toMatchObject({ correct: true }); // not understood: ignored
    expect(check('5 km', ref(5))).toMatchObject({ correct: true }); // a reference without a unit ignores the answer's
  });

  it('reads a percentage either way, as datasets store both', () => {
    expect(check('45%', ref(0.45)).correct).toBe(true);
    expect(check('45%', ref(45)).correct).toBe(true);
    expect(check('0.45', ref(45, '', 0.01, true)).correct).toBe(true);
    expect(check('46%', ref(0.45)).correct).toBe(false);
  });

  it('accepts inside the tolerance and rejects outside it, in any compatible unit (property)', () => {
    fc.assert(
      fc.property(fc.double({ min: 1e-6, max: 1e9, noNaN: true }), fc.constantFrom(0.001, 0.01, 0.05), fc.double({ min: 0, max: 0.9, noNaN: true }), fc.boolean(), (value, tolerance, frac, above) => {
        const r = ref(value, 'm', tolerance);
        const inside = value * (1 + (above ? 1 : -1) * tolerance * frac);
        const outside = value * (1 + (above ? 1 : -1) * tolerance * (1.1 + frac));
        expect(check(`${inside} m`, r).correct).toBe(true);
        expect(check(`${inside / 1000} km`, r).correct).toBe(true);
        expect(check(`${outside} m`, r).correct).toBe(false);
      }),
    );
  });

  it('needs exactly zero for a zero reference, and never throws on junk', () => {
    expect(check('0', ref(0)).correct).toBe(true);
    expect(check('1e-30', ref(0)).correct).toBe(false);
    fc.assert(fc.property(fc.string({ maxLength: 200 }), (s) => void check(s, ref(1, 'm'))));
  });
});
