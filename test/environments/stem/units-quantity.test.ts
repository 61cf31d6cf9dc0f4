import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { compareQuantity, parseQuantity, type NumericReference } from '../../../src/environments/stem/quantity.js';
import { builtinUnits, convertUnit } from '../../../src/environments/stem/units.js';

const unit = (text: string) => {
  const u = builtinUnits.parse(text);
  if (!u) throw new Error(`unit not understood: ${text}`);
  return u;
};
const convert = (value: number, from: string, to: string) => convertUnit(value, unit(from), unit(to));

describe('the built-in unit table', () => {
  it('converts between compatible units, prefixes and spellings included', () => {
    expect(convert(36, 'km/h', 'm/s')).toBeCloseTo(10, 12);
    expect(convert(1, 'kWh', 'MJ')).toBeCloseTo(3.6, 12);
    expect(convert(100, '°C', '°F')).toBeCloseTo(212, 9);
    expect(convert(0, 'degrees Celsius', 'K')).toBeCloseTo(273.15, 9);
    expect(convert(1, 'atm', 'kPa')).toBeCloseTo(101.325, 9);
    expect(convert(1, 'g/cm^3', 'kg/m^3')).toBeCloseTo(1000, 9);
    expect(convert(2, 'kilometers', 'm')).toBe(2000);
    expect(convert(1, 'MeV', 'J')).toBeCloseTo(1.602176634e-13, 25);
    expect(convert(180, 'deg', 'rad')).toBeCloseTo(Math.PI, 12);
    expect(convert(5, 'mL', 'L')).toBeCloseTo(0.005, 12);
  });

  it('reads products, quotients, powers and TeX alike', () => {
    const kms = unit('kg·m/s^2');
    for (const text of ['N', 'kg m s^-2', 'kg*m/s**2', 'kg m s-2', 'kg·m·s⁻²', '\\mathrm{kg\\,m\\,s^{-2}}', 'newtons']) expect(unit(text), text).toEqual(kms);
    expect(unit('J/mol K')).toEqual(unit('J/(mol·K)'));
    expect(unit('J/mol K')).toEqual(unit('J mol^-1 K^-1'));
  });

  it('refuses what it does not know, mixed dimensions, and affine scales inside products', () => {
    for (const text of ['furlong', 'm/', '°C/s', '°C^2', '', 'kt']) expect(builtinUnits.parse(text), text).toBeUndefined();
    expect(convert(1, 'm', 's')).toBeUndefined();
    expect(convert(1, 'deg', 'm/m')).toBeUndefined(); // angles are not plain numbers
  });

  it('round-trips any value through any pair of compatible units (property)', () => {
    const families = [['m', 'km', 'ft', 'in', 'mi', 'Å', 'au'], ['J', 'kJ', 'eV', 'cal', 'kWh', 'erg'], ['Pa', 'atm', 'bar', 'Torr', 'psi', 'mmHg'], ['K', '°C', '°F']];
    fc.assert(
      fc.property(fc.constantFrom(...families), fc.nat(), fc.nat(), fc.double({ min: -1e6, max: 1e6, noNaN: true }), (family, i, j, x) => {
        const [a, b] = [family[i % family.length]!, family[j % family.length]!];
        const back = convert(convert(x, a, b)!, b, a)!;
        expect(Math.abs(back - x)).toBeLessThanOrEqual(1e-9 * Math.max(1, Math.abs(x)) + (a.includes('°') || b.includes('°') ? 1e-9 : 0));
      }),
    );
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
    else expect(builtinUnits.parse(q.unitText)).toEqual(unit(unitText));
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
  const ref = (value: number, unitText = '', tolerance = 0.01, percent = false): NumericReference => ({ value, unitText, unit: builtinUnits.parse(unitText), tolerance, percent });
  const check = (answer: string, r: NumericReference) => compareQuantity(answer, r, builtinUnits);

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
