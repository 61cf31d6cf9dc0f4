/*
 * sandbox-init: PID 1 of every bubblewrap sandbox's PID namespace (bwrap --as-pid-1), built static by
 * scripts/setup.sh into .cache/bin/rollout-sandbox-init and bound read-only into the sandbox at /.sandbox-init.
 *
 * Why a program of our own: the namespace lives exactly as long as its PID 1, and PID 1 is the one process of the
 * namespace that its other processes cannot signal (the kernel drops every signal sent to it from inside the
 * namespace unless it has a handler, and SIGKILL/SIGSTOP always). bwrap's own init holds that place only until its
 * first child exits, and that child (a shell) was pid 2, the same uid as the model's commands: one `kill -9 -1` from
 * a tool call ended the sandbox, reported as infrastructure. This init is the holder itself:
 *
 *  - it says it is up (one byte, "r", on stdout), then lives until its stdin, the server's control pipe, reaches
 *    end of file (the server closes it, or dies) — or until the server kills it, which kills the whole namespace;
 *  - it never forks, so it needs no reaping of its own: SIGCHLD is ignored, so the kernel reaps every orphan
 *    reparented to it (a daemon the model started, a killed process's children) without zombies filling pids.max;
 *  - it is not dumpable, so the sandbox's processes (same uid) cannot ptrace it or open its descriptors through
 *    /proc/1/fd; the server, which owns the sandbox's user namespace, still can.
 */
#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(void) {
  struct sigaction ignore = {0};
  ignore.sa_handler = SIG_IGN;
  ignore.sa_flags = SA_NOCLDWAIT;
  if (sigaction(SIGCHLD, &ignore, 0) != 0) return 120;
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return 121;
  if (write(STDOUT_FILENO, "r", 1) != 1) return 122;
  char buf[256];
  for (;;) {
    ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n == 0) return 0;
    if (n < 0 && errno != EINTR) return 123;
  }
}
