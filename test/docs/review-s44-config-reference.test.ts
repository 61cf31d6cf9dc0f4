import { readFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parseConfig, serverConfigSchema } from '../../src/config.js';

/**
 * README.md's "Configuration reference" table against src/config.ts's zod schema: every key the schema takes is named
 * in the table, every key the table names exists, and every default the table states is the one parseConfig applies.
 * A key added to the schema without a row (or a default changed without the row) fails here.
 */
const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

/** The part of a zod 4 schema's definition this walk reads (wrappers, objects, arrays, pipes). */
interface Def {
  type: string;
  shape?: Record<string, { _zod: { def: Def } }>;
  innerType?: { _zod: { def: Def } };
  element?: { _zod: { def: Def } };
  in?: { _zod: { def: Def } };
  out?: { _zod: { def: Def } };
}

/** Every key path of the schema below `prefix`: `leaves` (scalars, lists of scalars, records) and `sections`. */
function walk(def: Def, prefix: string, leaves: Set<string>, sections: Set<string>): boolean {
  switch (def.type) {
    case 'object':
      for (const [key, child] of Object.entries(def.shape ?? {})) {
        const path = `${prefix}${key}`;
        if (walk(child._zod.def, `${path}.`, leaves, sections)) sections.add(path);
        else leaves.add(path);
      }
      return true;
    case 'default':
    case 'prefault':
    case 'optional':
    case 'nullable':
      return walk(def.innerType!._zod.def, prefix, leaves, sections);
    case 'pipe': {
      const a = walk(def.in!._zod.def, prefix, leaves, sections);
      const b = walk(def.out!._zod.def, prefix, leaves, sections);
      return a || b;
    }
    case 'array':
      return walk(def.element!._zod.def, `${prefix.slice(0, -1)}[].`, leaves, sections);
    default:
      return false;
  }
}

interface Row {
  keys: string[];
  defaults: string;
}

async function referenceRows(): Promise<Row[]> {
  const text = await readFile(join(root, 'README.md'), 'utf8');
  const start = text.indexOf('\n## Configuration reference\n');
  expect(start, 'README.md has a "Configuration reference" section').toBeGreaterThan(0);
  const section = text.slice(start + 1, text.indexOf('\n## ', start + 1));
  const rows = section
    .split('\n')
    .filter((line) => line.startsWith('| `'))
    .map((line) => {
      const [keys = '', defaults = ''] = line.split('|').slice(1).map((cell) => cell.trim());
      return { keys: [...keys.matchAll(/`([^`]+)`/g)].map((m) => m[1]!), defaults };
    });
  expect(rows.length).toBeGreaterThan(50);
  return rows;
}

function valueAt(config: unknown, path: string): unknown {
  return path.split('.').reduce<unknown>((node, key) => (node !== null && typeof node === 'object' ? (node as Record<string, unknown>)[key] : undefined), config);
}

/** Whether a table cell states `value`: a number as its first figure, a string/boolean/null in backticks. */
function states(cell: string, value: unknown): boolean {
  if (typeof value === 'number') return /^-?[\d.]+/.exec(cell)?.[0] === String(value);
  if (Array.isArray(value)) return value.length === 0 && cell.includes('`[]`');
  if (value !== null && typeof value === 'object') return Object.keys(value).length === 0 && cell.includes('`{}`');
  return cell.includes(`\`${String(value)}\``);
}

describe('README configuration reference (review s44)', () => {
  it('names every key of the schema and no key the schema lacks', async () => {
    const leaves = new Set<string>();
    const sections = new Set<string>();
    walk((serverConfigSchema as unknown as { _zod: { def: Def } })._zod.def, '', leaves, sections);
    expect(leaves.size).toBeGreaterThan(80);
    const documented = new Set((await referenceRows()).flatMap((row) => row.keys));
    expect([...leaves].filter((key) => !documented.has(key)), 'schema keys missing from the table').toEqual([]);
    expect([...documented].filter((key) => !leaves.has(key) && !sections.has(key)), 'table keys the schema does not take').toEqual([]);
  });

  it("states each default as parseConfig applies it", async () => {
    const defaults = parseConfig({});
    const wrong: string[] = [];
    for (const row of await referenceRows()) {
      const cells = row.keys.length > 1 ? row.defaults.split(', ') : [row.defaults];
      expect(cells.length, `one default per key in the row of ${row.keys.join(', ')}`).toBe(row.keys.length);
      row.keys.forEach((key, i) => {
        const value = valueAt(defaults, key);
        // Optional keys (model.dir, sandbox.image, tls, ...) have no default value; their rows say what unset means.
        if (value === undefined || key.startsWith('backends[]') || key === 'model') return;
        if (!states(cells[i]!, value)) wrong.push(`${key}: table says "${cells[i]!}", parseConfig gives ${JSON.stringify(value)}`);
      });
    }
    expect(wrong).toEqual([]);
  });
});
