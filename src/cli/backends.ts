import { connect as connectTo, connectionOptions, withinConnectTimeout, type ConnectionFlags } from './connection.js';
import type { RolloutClient } from '../client/rollout-client.js';
import { forTerminalLine } from './terminal-text.js';
import { BackendKind, CapacitySource, LogprobsMode, type Backend } from '../../gen/ts/rollout/v1/backend.js';

/** Where a server is and the admin token its BackendService needs (flag, else ROLLOUT_ADMIN_TOKEN). */
export interface BackendsOptions extends ConnectionFlags {
  address: string;
}

/** `rollout backends add` flags. */
export interface AddBackendFlags extends BackendsOptions {
  kind: 'vllm' | 'sglang';
  id?: string;
  model?: string;
  maxConcurrency?: number;
  logprobsMode?: 'raw' | 'processed';
}

/** A contract enum value without its prefix, lower case: LOGPROBS_MODE_PROCESSED → processed; 0 → `unknown`. */
function short(name: string | undefined, prefix: string): string {
  if (name === undefined || name.endsWith('_UNSPECIFIED')) return 'unknown';
  return name.slice(prefix.length).toLowerCase();
}

/**
 * The backends as a table for people: what ListBackends says, with the capacity's source (configured, engine,
 * default) and the logprobs mode (raw, processed, unknown) that trajectories sampled there record; below it, why each
 * unhealthy backend is not usable.
 */
export function formatBackends(backends: readonly Backend[]): string {
  const rows = [
    ['id', 'kind', 'healthy', 'capacity', 'logprobs', 'max_model_len', 'trajectories', 'requests', 'url'],
    ...backends.map((b) => [
      b.id,
      short(BackendKind[b.kind], 'BACKEND_KIND_'),
      b.draining ? 'draining' : b.healthy ? 'yes' : 'no',
      `${b.maxConcurrency} (${short(CapacitySource[b.capacitySource], 'CAPACITY_SOURCE_')})`,
      short(LogprobsMode[b.logprobsMode], 'LOGPROBS_MODE_'),
      b.maxModelLen > 0 ? String(b.maxModelLen) : 'unknown',
      String(b.inflightTrajectories),
      String(b.inflightRequests),
      b.url,
    ]),
  ];
  const cells = rows.map((r) => r.map(forTerminalLine));
  const widths = cells[0]!.map((_, i) => Math.max(...cells.map((r) => r[i]!.length)));
  const table = cells.map((r) => r.map((cell, i) => (i === r.length - 1 ? cell : cell.padEnd(widths[i]!))).join('  ')).join('\n');
  // Why each unhealthy backend takes no trajectories (an engine can answer its health checks and still be refused).
  const reasons = backends.filter((b) => !b.healthy && b.unusableReason !== '').map((b) => forTerminalLine(`${b.id}: not usable: ${b.unusableReason}`));
  return reasons.length === 0 ? table : `${table}\n\n${reasons.join('\n')}`;
}

/** A client of the server's BackendService: the admin token, else the trainer token (which a server without an admin token takes there). */
function connect(opts: BackendsOptions): RolloutClient {
  const options = connectionOptions(opts);
  return connectTo(opts.address, '--address', { ...options, ...(options.adminToken === undefined && options.token !== undefined && { adminToken: options.token }) });
}

/** `rollout backends`: prints the server's backends. */
export async function runBackendsList(opts: BackendsOptions): Promise<void> {
  const client = connect(opts);
  try {
    console.log(formatBackends(await withinConnectTimeout(client.backends, opts.address, opts, client.listBackends())));
  } finally {
    client.close();
  }
}

/** `rollout backends add <url>`: adds an engine and prints what the server learned about it. */
export async function runBackendsAdd(url: string, opts: AddBackendFlags): Promise<void> {
  const client = connect(opts);
  try {
    const backend = await withinConnectTimeout(client.backends, opts.address, opts, client.addBackend({
      url,
      kind: opts.kind === 'sglang' ? BackendKind.BACKEND_KIND_SGLANG : BackendKind.BACKEND_KIND_VLLM,
      ...(opts.id !== undefined && { id: opts.id }),
      ...(opts.model !== undefined && { model: opts.model }),
      ...(opts.maxConcurrency !== undefined && { maxConcurrency: opts.maxConcurrency }),
      ...(opts.logprobsMode !== undefined && {
        logprobsMode: opts.logprobsMode === 'raw' ? LogprobsMode.LOGPROBS_MODE_RAW : LogprobsMode.LOGPROBS_MODE_PROCESSED,
      }),
    }));
    if (backend !== undefined) console.log(formatBackends([backend]));
  } finally {
    client.close();
  }
}
