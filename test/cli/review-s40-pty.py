"""Runs a command on a new pseudo-terminal, as a person's terminal window runs it (the command is the session leader
and the terminal is its controlling one), and hangs the terminal up when told: a test double of a terminal window.

Relays everything the command writes to the terminal to stdout (after a line `PTY-CHILD <pid>`). A line `hangup` on
stdin closes the terminal's master side, so the kernel hangs the terminal up: SIGHUP to the command, and every later
write of it to the terminal fails EIO, as when the window is closed or the ssh session drops. Then waits for the
command and prints `PTY-EXIT {"code": ..., "signal": ...}`.
"""
import json
import os
import pty
import select
import sys

pid, master = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
sys.stdout.write(f"PTY-CHILD {pid}\n")
sys.stdout.flush()
while True:
    ready, _, _ = select.select([master, sys.stdin], [], [])
    if master in ready:
        try:
            data = os.read(master, 65536)
        except OSError:
            data = b""
        if data:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        else:
            break  # the command closed the terminal (it exited)
    if sys.stdin in ready:
        line = sys.stdin.readline()
        if line == "" or line.strip() == "hangup":
            break
os.close(master)
_, status = os.waitpid(pid, 0)
result = {"code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None, "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}
sys.stdout.write("PTY-EXIT " + json.dumps(result) + "\n")
sys.stdout.flush()
