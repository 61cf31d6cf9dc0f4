/**
 * JSON with object keys sorted at every depth, so two values that differ only in key order — a Struct or a map
 * whose entries another client wrote in another order (Go randomises map iteration) — give the same string.
 * Arrays keep their order (it means something). Meant for plain JSON data (instances, metadata, resolved specs).
 */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(sortKeys(value));
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value === null || typeof value !== 'object') return value;
  // No prototype: a key named "__proto__" (legal in JSON, and in a Struct) stays an own property.
  const out: Record<string, unknown> = Object.create(null) as Record<string, unknown>;
  for (const key of Object.keys(value).sort()) out[key] = sortKeys((value as Record<string, unknown>)[key]);
  return out;
}
