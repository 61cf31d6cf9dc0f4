import { readFileSync } from 'node:fs';

/**
 * A process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or undefined when no such process
 * exists (or it is a zombie). With the pid it identifies a process for good: a pid reused after the owner died
 * gets another start time, so "pid + start time still alive" proves an owner is live, not just its number.
 */
export function processStartTime(pid: number): string | undefined {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // Fields after the parenthesised command name (which may hold spaces): state is field 3, starttime field 22.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  if (fields[0] === 'Z') return undefined;
  return fields[19];
}

/**
 * True when a process with this PID exists (EPERM: it exists, as another user). A reused PID reads as alive, so
 * callers (the Apptainer reaper, lock files) err on the side of leaving things alone.
 */
export function isProcessAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
