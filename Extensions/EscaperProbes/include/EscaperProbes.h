// Raw system calls for the Escaper probe extension (Swift cannot call the variadic syscall(2)). Each returns
// the call's result, or -1 with errno set.
#ifndef ESCAPER_PROBES_H
#define ESCAPER_PROBES_H
#include <sys/types.h>

long probe_unshare(int flags);
/// PTRACE_SEIZE then, if that worked, PTRACE_DETACH at once.
long probe_ptrace_seize(pid_t pid);
long probe_io_uring_setup(void);
long probe_userfaultfd(void);
/// BPF_MAP_CREATE of a one-entry array map.
long probe_bpf_map(void);
/// perf_event_open of a software task-clock counter on the calling thread.
long probe_perf_event(void);
/// add_key("user", ...) into the process keyring.
long probe_add_key(void);
long probe_memfd(void);
/// An executable memfd (no MFD_NOEXEC_SEAL), then execveat of it while it is empty: 0 if the exec reached the
/// loader (ENOEXEC), -1 if refused.
long probe_memfd_exec(void);
/// prlimit64(pid, RLIMIT_NOFILE) as a query only.
long probe_prlimit(pid_t pid);
/// setpriority(pid) to the value getpriority(pid) reads: no change if allowed.
long probe_setpriority(pid_t pid);
/// sched_setaffinity(pid) to the mask sched_getaffinity(pid) reads.
long probe_affinity(pid_t pid);
/// chmod(path) to its own mode.
long probe_chmod(const char *path);
/// utimensat(path) to the times it has.
long probe_utime(const char *path);
/// setxattr(path, user.sdkhost-probe) and, if it worked, removexattr.
long probe_xattr(const char *path);
/// An inotify watch on path.
long probe_inotify(const char *path);
/// A one-byte datagram to the named socket at path, from a new datagram socket (pair == 0) or one of a
/// datagram socket pair (pair == 1).
long probe_dgram(const char *path, int pair);
/// mount a 1 MiB tmpfs over `folder` and, if it worked, unmount it at once.
long probe_mount(const char *folder);
/// A raw clone3 with no flags but SIGCHLD: ENOSYS under the sandbox. A child that appears exits at once.
long probe_clone3(void);
/// getpid through the x32 system call table (x86-64 only): seccomp kills the process with SIGSYS.
long probe_x32(void);
/// Forks, and the child execs this same program (/proc/self/exe), which reports its credentials before any
/// Swift code runs: the capability lines and NoNewPrivs of its /proc/self/status, into `out`. Returns the
/// length written, or -errno (a refused fork or exec).
long probe_exec_self(char *out, long size);
/// The names in the folder `path` (not "." or ".."), each followed by a newline, into `out`. Returns the length
/// written, or -errno.
long probe_list(const char *path, char *out, long size);

#endif
