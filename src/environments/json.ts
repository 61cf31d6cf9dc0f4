/** A JSON value: what an environment may put in a report (it travels as google.protobuf.Struct). */
export type JsonValue = null | boolean | number | string | JsonValue[] | JsonObject;
export interface JsonObject {
  [key: string]: JsonValue;
}

/**
 * How deep a report may nest. The trainer's decoders guard recursion (ts-proto and Python protobuf stop at 100
 * message levels; each JSON level is three: Struct, entry, Value, under Trajectory and the response): a deeper
 * report would encode here and fail to decode there, taking the trainer's stream down with it.
 */
export const MAX_JSON_DEPTH = 20;

/**
 * Why `value` is not a plain JSON value, with the path of the first offender (e.g. "report.scores[2]: a
 * bigint"), or undefined when it is one. Rejects what Struct cannot carry faithfully or at all: bigints, NaN and
 * infinities, functions, symbols, cycles, class instances (Date, Map, Buffer), holes, and nesting past
 * {@link MAX_JSON_DEPTH}. Object properties that are undefined are allowed (they are dropped, as JSON does).
 */
export function jsonProblem(value: unknown, path = 'value'): string | undefined {
  return check(value, path, 0, new Set());
}

function check(value: unknown, path: string, depth: number, seen: Set<object>): string | undefined {
  switch (typeof value) {
    case 'string':
    case 'boolean':
      return undefined;
    case 'number':
      return Number.isFinite(value) ? undefined : `${path}: ${value} is not a finite number`;
    case 'object':
      break;
    default:
      return `${path}: a ${typeof value} is not JSON`;
  }
  if (value === null) return undefined;
  if (depth >= MAX_JSON_DEPTH) return `${path}: nested deeper than ${MAX_JSON_DEPTH} levels`;
  if (seen.has(value)) return `${path}: a cycle`;
  seen.add(value);
  try {
    if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) {
        if (!(i in value)) return `${path}[${i}]: a hole`;
        const problem = check(value[i], `${path}[${i}]`, depth + 1, seen);
        if (problem) return problem;
      }
      return undefined;
    }
    const proto = Object.getPrototypeOf(value) as unknown;
    if (proto !== Object.prototype && proto !== null) return `${path}: a ${(value as object).constructor?.name ?? 'class instance'} is not a plain JSON object`;
    for (const [key, inner] of Object.entries(value)) {
      if (inner === undefined) continue;
      const problem = check(inner, `${path}.${key}`, depth + 1, seen);
      if (problem) return problem;
    }
    return undefined;
  } finally {
    seen.delete(value);
  }
}
