import type { SandboxProcess, SpawnOptions } from './types.js';
import { INTERRUPT_SIGNAL } from './shell-framing.js';

/** How a persistent shell starts processes inside its sandbox: `Sandbox.spawn`, or a test's stand-in. */
export type SpawnFunction = (argv: readonly string[], options?: SpawnOptions) => SandboxProcess;

/**
 * The in-sandbox program that interrupts the command a persistent shell is running. The host can only reach
 * processes inside a sandbox through the sandbox, so this runs as a second process there (`spawn`), not as a
 * host `kill`: it sends the shell SIGUSR1 (its trap abandons the rest of the command once the foreground job
 * is gone), then freezes and SIGKILLs every descendant of the shell, found by walking /proc parent links —
 * by PID ancestry, never by name. Up to three rounds catch children forked while the walk ran.
 *
 * What it cannot reach: processes that left the shell's tree (setsid plus double fork, reparented to the
 * sandbox's init). They live until the sandbox stops. Background jobs of earlier commands are descendants and
 * die too: a timeout ends everything the shell was running, as closing a terminal would, but keeps the shell.
 */
const INTERRUPT_SCRIPT = `
shell=$1
kill -${INTERRUPT_SIGNAL} "$shell" 2>/dev/null || exit 0
for round in 1 2 3; do
  unset kids; declare -A kids=()
  for f in /proc/[0-9]*/stat; do
    line=
    { read -r line < "$f"; } 2>/dev/null || continue
    rest=\${line##*) }
    set -- $rest
    p=\${f#/proc/}; p=\${p%/stat}
    kids[$2]+=" $p"
  done
  victims=(); queue=(\${kids[$shell]})
  while ((\${#queue[@]} > 0)); do
    p=\${queue[0]}; queue=("\${queue[@]:1}"); victims+=("$p"); queue+=(\${kids[$p]})
  done
  ((\${#victims[@]} > 0)) || break
  kill -STOP "\${victims[@]}" 2>/dev/null; kill -KILL "\${victims[@]}" 2>/dev/null
done
exit 0
`;

/**
 * Runs the interrupter for the shell with in-sandbox PID `shellPid` and waits until it is done. Never throws:
 * a failed interrupt shows up as a missing end marker, which makes the caller restart the shell.
 */
export async function interruptShell(spawn: SpawnFunction, shellPid: number): Promise<void> {
  let proc: SandboxProcess;
  try {
    proc = spawn(['bash', '--noprofile', '--norc', '-c', INTERRUPT_SCRIPT, 'rollout-interrupt', String(shellPid)]);
  } catch {
    return;
  }
  proc.stdin.on('error', () => undefined);
  proc.stdin.end();
  proc.stdout.resume();
  proc.stderr.resume();
  await proc.exited;
}
