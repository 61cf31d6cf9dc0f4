/**
 * The V8 flags the `rollout` command runs node with: bin/rollout.js's shebang line passes them (`env -S`), and
 * whatever starts a server process on its own (the benchmarks, tests that spawn `rollout serve`) passes these, so
 * what is measured is what operators run. test/cli/node-flags.test.ts keeps the shebang and this list equal.
 *
 * --max-semi-space-size=64: a server allocates short-lived objects per request at a high rate (HTTP bodies,
 * token arrays, protobuf messages); V8's default young generation (16 MiB semi-spaces) scavenges so often that
 * collection was ~9% of server CPU. 64 MiB: bench/orchestration's server CPU per LLM turn 604–616 → 565 µs, for
 * at most ~100 MiB more resident memory. A flag in NODE_OPTIONS still applies (node reads both).
 *
 * Measured and not taken (2-core VM, engine double and client beside the server, alternating runs):
 * --single-threaded-gc cut server CPU per LLM turn ~8% (614/632/599 → 586/550/564 µs; the V8 helper threads' marking
 * and sweeping move to the main thread), but the event loop's delay grew (server pass p99 11-15 → 14-17 ms, max at
 * 64K-token contexts 9-16 → 16-20 ms): a trade for an operator on a host with few cores, through NODE_OPTIONS.
 * --no-parallel-scavenge alone changed nothing measurable.
 */
export const NODE_FLAGS: readonly string[] = ['--max-semi-space-size=64'];
