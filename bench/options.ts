import { InvalidArgumentError } from 'commander';

/** commander parsers shared by the benchmarks' options. */

/** An integer ≥ 1 (counts: trajectories, concurrency, seeds). */
export const positiveInt = (value: string): number => {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError('must be a positive integer');
  return n;
};

/** Comma-separated integers ≥ 1 ("1000,500,250": durations in ms, server counts, ...). */
export const positiveIntList = (value: string): number[] => value.split(',').map((part) => positiveInt(part.trim()));

/** A number > 0 (durations in minutes or seconds). */
export const positiveNumber = (value: string): number => {
  const n = Number(value);
  if (!(n > 0)) throw new InvalidArgumentError(`not a positive number: ${value}`);
  return n;
};

/** A number strictly between 0 and 1. */
export const fraction = (value: string): number => {
  const n = Number(value);
  if (!(n > 0 && n < 1)) throw new InvalidArgumentError(`not in (0, 1): ${value}`);
  return n;
};
