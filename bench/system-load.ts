import { readFileSync } from 'node:fs';

/**
 * CPU time (µs) all processes of the machine have spent, from /proc/stat (user, nice, system, irq, softirq,
 * steal; USER_HZ = 100); undefined where there is no /proc. Subtracting the benchmark's own processes shows how
 * much other work (tests, builds) competed with a pass — wall-clock figures are only comparable when it is ~0.
 */
export function machineBusyMicros(): number | undefined {
  try {
    const fields = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0]!.trim().split(/\s+/).slice(1).map(Number);
    const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = fields;
    return (user + nice + system + irq + softirq + steal) * 10_000;
  } catch {
    return undefined;
  }
}
