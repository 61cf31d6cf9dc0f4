/**
 * JSON with object keys sorted at every depth, so two values that differ only in key order — a Struct or a map
 * whose entries another client wrote in another order (Go randomises map iteration) — give the same string.
 * Arrays keep their order (it means something). Meant for plain JSON data (instances, metadata, resolved specs).
 *
 * The string is exactly `JSON.stringify` of a copy whose objects were rebuilt with their keys inserted in sorted order
 * (how this was first written; property-tested equal): so array-index keys ("0", "10", "2") come first in numeric
 * order, as JavaScript orders them in any object, then the other keys by UTF-16 code units; a key named "__proto__"
 * is an ordinary key. The strings are persisted (dataset task ids derive from them, see submit-dataset.ts) and must
 * not change. Written directly, without the sorted copy: this runs on every admitted task.
 */
export function canonicalJson(value: unknown): string {
  return write(value) as string;
}

function write(value: unknown): string | undefined {
  if (value === null) return 'null';
  switch (typeof value) {
    case 'string':
    case 'number':
    case 'bigint':
      // JSON.stringify's own spelling: escapes, -0 as 0, non-finite numbers as null; a bigint throws its TypeError.
      return JSON.stringify(value);
    case 'boolean':
      return value ? 'true' : 'false';
    case 'object':
      return Array.isArray(value) ? writeArray(value) : writeObject(value as Record<string, unknown>);
    default:
      // undefined, functions, symbols: left out of objects, null in arrays.
      return undefined;
  }
}

function writeArray(values: readonly unknown[]): string {
  let out = '[';
  for (let i = 0; i < values.length; i++) out += (i > 0 ? ',' : '') + (write(values[i]) ?? 'null');
  return `${out}]`;
}

function writeObject(object: Record<string, unknown>): string {
  const indices: string[] = [];
  const names: string[] = [];
  for (const key of Object.keys(object)) (isArrayIndex(key) ? indices : names).push(key);
  if (indices.length > 1) indices.sort((a, b) => Number(a) - Number(b));
  if (names.length > 1) names.sort();
  let out = '{';
  let first = true;
  for (const keys of [indices, names]) {
    for (const key of keys) {
      const v = write(object[key]);
      if (v === undefined) continue;
      out += `${first ? '' : ','}${JSON.stringify(key)}:${v}`;
      first = false;
    }
  }
  return `${out}}`;
}

/** Whether a key is an array index (a canonical integer below 2^32 − 1), which objects order first, numerically. */
function isArrayIndex(key: string): boolean {
  const c = key.charCodeAt(0);
  if (c < 48 || c > 57) return false;
  if (key === '0') return true;
  return /^[1-9][0-9]{0,9}$/.test(key) && Number(key) < 4294967295;
}
