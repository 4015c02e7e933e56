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

#endif
