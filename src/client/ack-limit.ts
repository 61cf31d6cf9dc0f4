import type { Metadata } from '@grpc/grpc-js';

/**
 * The most entries one Ack may list when the server does not say (a server older than the `rollout-max-ack-entries`
 * header): the protocol's bound (contract/session.ts MAX_ACK_ENTRIES), which servers may only lower.
 */
export const DEFAULT_MAX_ACK_ENTRIES = 65_536;

/**
 * The per-Ack bound a Rollout stream's response headers advertise (`rollout-max-ack-entries`). A missing, garbage or
 * non-positive value gives {@link DEFAULT_MAX_ACK_ENTRIES}: acking must go on whatever a server sends (a 0 taken at its
 * word would split acks into nothing). Repeated, the smallest value counts.
 */
export function maxAckEntriesOf(headers: Metadata): number {
  const values = headers.get('rollout-max-ack-entries').flatMap((v) => (typeof v === 'string' && /^[0-9]{1,15}$/.test(v) ? [Number(v)] : []));
  const positive = values.filter((n) => n > 0);
  return positive.length > 0 ? Math.min(...positive) : DEFAULT_MAX_ACK_ENTRIES;
}
