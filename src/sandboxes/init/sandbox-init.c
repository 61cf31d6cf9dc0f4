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
 *    /proc/1/fd; the server, which owns the sandbox's user namespace, still can;
 *  - it holds no descriptor but its stdin, stdout and stderr.
 *
 * The same binary is the descriptor closer of every launch (`--keep-fds LIST -- ARGV...`, see fd-closer.ts): it
 * closes every descriptor but 0, 1, 2 and the comma-separated LIST, then execs ARGV (PATH search). Why: a descriptor
 * the server inherited without close-on-exec (a harness's pipe) passes through spawn, bwrap, nsenter and apptainer
 * into every sandboxed process, which could then read or write a host pipe; no tool of the launch chain closes it.
 * Exits 127 (ENOENT) or 126 (other errors) with a message when ARGV cannot be run, like a shell.
 *
 * And `--mount-devpts MAX`: mounts a devpts instance of at most MAX ptys over /dev/pts (run by the server, with the
 * privilege it has over the sandbox's mount namespace, right after start; see bwrap-ptys.ts). Why: bwrap's own devpts
 * instance has no limit of its own, and every instance but the host's draws on one pool (kernel.pty.max minus
 * kernel.pty.reserve, 3072 by default): one sandbox opening /dev/ptmx 3071 times left every other sandbox of the host
 * without a pty. Inside the sandbox (no capabilities) this mode fails with EPERM.
 *
 * And `--read-file NOTREG MAX PATH`: the file read of the server's readFile (sandbox-files.ts), run inside the sandbox
 * as its user. Opens PATH with O_NONBLOCK, exits NOTREG unless the descriptor is a regular file (fstat: what was
 * opened, not what the path names a moment later), then copies at most MAX bytes to stdout. Why: the read script
 * checks the path and then opens it; a FIFO the sandboxed program puts there in between blocks a plain open (head,
 * busybox's dd, which has no iflag=nonblock) until the command timeout, reported as an infrastructure failure.
 *
 * And `--write-file NOTREG PATH`: the write of writeFile, the same way: opens PATH for writing (created 0666 less the
 * umask, truncated, as a shell's `>`) with O_NONBLOCK, so a FIFO put there fails the open (ENXIO: no reader) instead of
 * blocking it; exits NOTREG without writing unless what was opened is a regular file; then copies stdin to it.
 *
 * And `--list-dir PATH`: listDir's listing, the records GNU `find PATH -mindepth 1 -maxdepth 1 -printf '%y %s %f\0'`
 * writes (type letter, size, name), read with readdir and fstatat (symlinks not followed), so an image without GNU
 * find (busybox's has no -printf) can be listed too. Exit 0, or 1 when PATH cannot be opened as a directory.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

#define MAX_KEEP 64

/* Closes every descriptor >= 3 not in keep (sorted ascending, each >= 3). 0 on success. */
static int close_others(const int *keep, int nkeep) {
  unsigned int from = 3;
  int ok = 1;
  for (int i = 0; i <= nkeep && ok; i++) {
    unsigned int to = i < nkeep ? (unsigned int)keep[i] : ~0U;
    if (to > from && syscall(SYS_close_range, from, to - 1, 0) != 0) ok = 0;
    if (i < nkeep) from = (unsigned int)keep[i] + 1;
  }
  if (ok) return 0;
  /* No close_range (kernel < 5.9): every descriptor /proc lists, but the directory's own. */
  DIR *dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int self = dirfd(dir);
  struct dirent *entry;
  int fds[4096];
  int n = 0;
  while ((entry = readdir(dir)) != 0 && n < 4096) {
    char *end;
    long fd = strtol(entry->d_name, &end, 10);
    if (*end != '\0' || entry->d_name[0] == '\0' || fd < 3 || fd == self) continue;
    int kept = 0;
    for (int i = 0; i < nkeep; i++) kept |= keep[i] == fd;
    if (!kept) fds[n++] = (int)fd;
  }
  closedir(dir);
  for (int i = 0; i < n; i++) close(fds[i]);
  return n == 4096 ? -1 : 0;
}

static int compare(const void *a, const void *b) {
  return *(const int *)a - *(const int *)b;
}

static int closer(int argc, char **argv) {
  /* argv: --keep-fds LIST -- ARGV... */
  if (argc < 5 || strcmp(argv[3], "--") != 0) {
    fputs("usage: rollout-sandbox-init --keep-fds FD,FD,... -- ARGV...\n", stderr);
    return 125;
  }
  int keep[MAX_KEEP];
  int nkeep = 0;
  for (char *p = argv[2]; *p != '\0';) {
    char *end;
    long fd = strtol(p, &end, 10);
    if (end == p || fd < 0 || fd > 1 << 20 || nkeep == MAX_KEEP || (*end != ',' && *end != '\0')) {
      fprintf(stderr, "rollout-sandbox-init: bad descriptor list %s\n", argv[2]);
      return 125;
    }
    if (fd >= 3) keep[nkeep++] = (int)fd;
    p = *end == ',' ? end + 1 : end;
  }
  qsort(keep, (size_t)nkeep, sizeof keep[0], compare);
  if (close_others(keep, nkeep) != 0) {
    fprintf(stderr, "rollout-sandbox-init: cannot close inherited descriptors: %s\n", strerror(errno));
    return 125;
  }
  execvp(argv[4], argv + 4);
  int err = errno;
  fprintf(stderr, "rollout-sandbox-init: cannot run %s: %s\n", argv[4], strerror(err));
  return err == ENOENT ? 127 : 126;
}

static int mount_devpts(int argc, char **argv) {
  char *end;
  long max = argc == 3 ? strtol(argv[2], &end, 10) : -1;
  if (max < 1 || max > 1 << 20 || *end != '\0') {
    fputs("usage: rollout-sandbox-init --mount-devpts MAX\n", stderr);
    return 125;
  }
  char options[128];
  snprintf(options, sizeof options, "newinstance,ptmxmode=0666,mode=620,max=%ld", max);
  if (mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, options) != 0) {
    fprintf(stderr, "rollout-sandbox-init: cannot mount devpts (%s) on /dev/pts: %s\n", options, strerror(errno));
    return 1;
  }
  return 0;
}

static int read_file(int argc, char **argv) {
  /* argv: --read-file NOTREG MAX PATH */
  char *end1 = 0, *end2 = 0;
  long notreg = argc == 5 ? strtol(argv[2], &end1, 10) : -1;
  long long max = argc == 5 ? strtoll(argv[3], &end2, 10) : -1;
  if (notreg < 1 || notreg > 125 || *end1 != '\0' || max < 0 || *end2 != '\0') {
    fputs("usage: rollout-sandbox-init --read-file NOTREG MAX PATH\n", stderr);
    return 125;
  }
  int fd = open(argv[4], O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "rollout-sandbox-init: cannot open %s: %s\n", argv[4], strerror(errno));
    return 1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    fprintf(stderr, "rollout-sandbox-init: cannot stat %s: %s\n", argv[4], strerror(errno));
    return 1;
  }
  if (!S_ISREG(st.st_mode)) return (int)notreg;
  /* A regular file ignores O_NONBLOCK; cleared all the same, so no read can end early with EAGAIN. */
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    fprintf(stderr, "rollout-sandbox-init: cannot clear O_NONBLOCK on %s: %s\n", argv[4], strerror(errno));
    return 1;
  }
  /* 64 KiB reads: MAX is a whole number of pages, which /proc/self/pagemap needs of every read. */
  static char buf[65536];
  while (max > 0) {
    ssize_t n = read(fd, buf, max < (long long)sizeof buf ? (size_t)max : sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      fprintf(stderr, "rollout-sandbox-init: cannot read %s: %s\n", argv[4], strerror(errno));
      return 1;
    }
    if (n == 0) break;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = write(STDOUT_FILENO, buf + off, (size_t)(n - off));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return 1;
      off += w;
    }
    max -= n;
  }
  return 0;
}

static int write_file(int argc, char **argv) {
  /* argv: --write-file NOTREG PATH */
  char *end = 0;
  long notreg = argc == 4 ? strtol(argv[2], &end, 10) : -1;
  if (notreg < 1 || notreg > 125 || *end != '\0') {
    fputs("usage: rollout-sandbox-init --write-file NOTREG PATH\n", stderr);
    return 125;
  }
  int fd = open(argv[3], O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0666);
  if (fd < 0) {
    fprintf(stderr, "rollout-sandbox-init: cannot open %s: %s\n", argv[3], strerror(errno));
    return 1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    fprintf(stderr, "rollout-sandbox-init: cannot stat %s: %s\n", argv[3], strerror(errno));
    return 1;
  }
  if (!S_ISREG(st.st_mode)) return (int)notreg;
  /* Truncated only once it is known to be a regular file (O_TRUNC at the open would apply to whatever it was). */
  int flags = fcntl(fd, F_GETFL);
  if (ftruncate(fd, 0) != 0 || flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    fprintf(stderr, "rollout-sandbox-init: cannot truncate %s: %s\n", argv[3], strerror(errno));
    return 1;
  }
  static char buf[65536];
  for (;;) {
    ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      fprintf(stderr, "rollout-sandbox-init: cannot read stdin: %s\n", strerror(errno));
      return 1;
    }
    if (n == 0) break;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = write(fd, buf + off, (size_t)(n - off));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        fprintf(stderr, "rollout-sandbox-init: cannot write %s: %s\n", argv[3], strerror(errno));
        return 1;
      }
      off += w;
    }
  }
  if (close(fd) != 0) {
    fprintf(stderr, "rollout-sandbox-init: cannot write %s: %s\n", argv[3], strerror(errno));
    return 1;
  }
  return 0;
}

static char type_letter(mode_t mode) {
  if (S_ISREG(mode)) return 'f';
  if (S_ISDIR(mode)) return 'd';
  if (S_ISLNK(mode)) return 'l';
  if (S_ISFIFO(mode)) return 'p';
  if (S_ISSOCK(mode)) return 's';
  if (S_ISCHR(mode)) return 'c';
  if (S_ISBLK(mode)) return 'b';
  return 'U';
}

static int list_dir(int argc, char **argv) {
  /* argv: --list-dir PATH */
  if (argc != 3) {
    fputs("usage: rollout-sandbox-init --list-dir PATH\n", stderr);
    return 125;
  }
  /* O_NONBLOCK: a FIFO put at PATH fails the O_DIRECTORY open instead of blocking it. */
  int fd = open(argv[2], O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
  DIR *dir = fd < 0 ? NULL : fdopendir(fd);
  if (dir == NULL) {
    fprintf(stderr, "rollout-sandbox-init: cannot list %s: %s\n", argv[2], strerror(errno));
    return 1;
  }
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL) {
    if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
    struct stat st;
    /* Gone between readdir and stat (the program deleted it): not listed, as find skips it. */
    if (fstatat(dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (printf("%c %lld %s", type_letter(st.st_mode), (long long)st.st_size, entry->d_name) < 0 || putchar('\0') == EOF) return 1;
  }
  closedir(dir);
  return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--keep-fds") == 0) return closer(argc, argv);
  if (argc > 1 && strcmp(argv[1], "--mount-devpts") == 0) return mount_devpts(argc, argv);
  if (argc > 1 && strcmp(argv[1], "--read-file") == 0) return read_file(argc, argv);
  if (argc > 1 && strcmp(argv[1], "--write-file") == 0) return write_file(argc, argv);
  if (argc > 1 && strcmp(argv[1], "--list-dir") == 0) return list_dir(argc, argv);
  if (argc > 1) {
    fputs("usage: rollout-sandbox-init (as pid 1), --keep-fds FD,FD,... -- ARGV..., --mount-devpts MAX,\n"
          "  --read-file NOTREG MAX PATH, --write-file NOTREG PATH or --list-dir PATH\n", stderr);
    return 125;
  }
  struct sigaction ignore = {0};
  ignore.sa_handler = SIG_IGN;
  ignore.sa_flags = SA_NOCLDWAIT;
  if (sigaction(SIGCHLD, &ignore, 0) != 0) return 120;
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return 121;
  if (close_others(0, 0) != 0) return 124;
  if (write(STDOUT_FILENO, "r", 1) != 1) return 122;
  char buf[256];
  for (;;) {
    ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n == 0) return 0;
    if (n < 0 && errno != EINTR) return 123;
  }
}
