// Landlock, seccomp and capabilities for the launcher (see sandbox.h and docs/SECURITY.md).
#define _GNU_SOURCE
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/securebits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <linux/prctl.h>

// MARK: Landlock. The system headers may predate ABI 4-6, so the structures and rights are declared here.

struct ll_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;  // ABI 4
    uint64_t scoped;              // ABI 6
};
struct ll_path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1

#define LL_FS_EXECUTE (1ULL << 0)
#define LL_FS_WRITE_FILE (1ULL << 1)
#define LL_FS_READ_FILE (1ULL << 2)
#define LL_FS_READ_DIR (1ULL << 3)
#define LL_FS_REFER (1ULL << 13)     // ABI 2
#define LL_FS_TRUNCATE (1ULL << 14)  // ABI 3
#define LL_FS_IOCTL_DEV (1ULL << 15) // ABI 5
#define LL_NET_BIND_TCP (1ULL << 0)
#define LL_NET_CONNECT_TCP (1ULL << 1)
#define LL_SCOPE_ABSTRACT_UNIX (1ULL << 0)
#define LL_SCOPE_SIGNAL (1ULL << 1)

/// Rights that may be granted on a file (the rest only make sense on directories).
#define LL_FILE_RIGHTS (LL_FS_EXECUTE | LL_FS_WRITE_FILE | LL_FS_READ_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV)

int landlock_abi(void) {
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LL_CREATE_RULESET_VERSION);
    return abi < 0 ? -errno : (int)abi;
}

static uint64_t handled_fs_for(int abi) {
    uint64_t all = (1ULL << 13) - 1;  // ABI 1: execute ... make_sym
    if (abi >= 2) all |= LL_FS_REFER;
    if (abi >= 3) all |= LL_FS_TRUNCATE;
    if (abi >= 5) all |= LL_FS_IOCTL_DEV;
    return all;
}

void note_skipped(char *skipped, size_t size, const char *path, int error) {
    size_t used = strlen(skipped);
    if (used + 2 >= size) return;
    snprintf(skipped + used, size - used, "%s%s (%s)", used ? ", " : "", path, strerror(error));
}

static int add_paths(int ruleset, const struct paths *list, uint64_t access, uint64_t handled, char *skipped,
                     size_t skipped_size) {
    for (size_t i = 0; i < list->count; i++) {
        int fd = open(list->items[i], O_PATH | O_CLOEXEC);
        if (fd < 0) {
            note_skipped(skipped, skipped_size, list->items[i], errno);
            continue;
        }
        struct stat st;
        uint64_t allowed = access & handled;
        if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) allowed &= LL_FILE_RIGHTS;
        struct ll_path_beneath_attr rule = {.allowed_access = allowed, .parent_fd = fd};
        long rc = allowed == 0 ? 0 : syscall(SYS_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &rule, 0);
        int error = errno;
        close(fd);
        if (rc != 0) return error;
    }
    return 0;
}

int apply_landlock(const struct profile *p, int *abi_out, char *skipped, size_t skipped_size, const char **why) {
    int abi = landlock_abi();
    if (abi < 0) {
        *why = abi == -ENOSYS ? "the kernel has no Landlock (ENOSYS)"
             : abi == -EOPNOTSUPP ? "Landlock is disabled at boot (EOPNOTSUPP)" : strerror(-abi);
        return -abi;
    }
    *abi_out = abi;
    struct ll_ruleset_attr attr = {.handled_access_fs = handled_fs_for(abi)};
    size_t size = sizeof(uint64_t);
    if (abi >= 4) {
        size = 2 * sizeof(uint64_t);
        if (!p->network) attr.handled_access_net = LL_NET_BIND_TCP | LL_NET_CONNECT_TCP;
    }
    if (abi >= 6) {
        size = sizeof attr;
        attr.scoped = LL_SCOPE_ABSTRACT_UNIX | LL_SCOPE_SIGNAL;
    }
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, size, 0);
    if (ruleset < 0) {
        *why = "landlock_create_ruleset failed";
        return errno;
    }
    uint64_t handled = attr.handled_access_fs;
    uint64_t read = LL_FS_READ_FILE | LL_FS_READ_DIR;
    uint64_t write = handled & ~LL_FS_EXECUTE;
    // What every worker reads and writes besides its grants: its own /proc and the four device nodes.
    static char *device_reads[] = {"/proc", "/dev/urandom", "/dev/random", "/dev/zero"};
    static char *device_writes[] = {"/dev/null"};
    static char *root_writes[] = {"/dev/null", "/tmp"};
    struct paths reads = {device_reads, 4}, writes = {p->root_built ? root_writes : device_writes, p->root_built ? 2 : 1};
    int rc = add_paths(ruleset, &p->executable_paths, LL_FS_EXECUTE | read, handled, skipped, skipped_size);
    if (rc == 0) rc = add_paths(ruleset, &reads, read, handled, skipped, skipped_size);
    if (rc == 0) rc = add_paths(ruleset, &writes, write, handled, skipped, skipped_size);
    if (rc == 0) rc = add_paths(ruleset, &p->readable, read, handled, skipped, skipped_size);
    if (rc == 0) rc = add_paths(ruleset, &p->writable, write, handled, skipped, skipped_size);
    if (rc != 0) {
        close(ruleset);
        *why = "landlock_add_rule failed";
        return rc;
    }
    rc = syscall(SYS_landlock_restrict_self, ruleset, 0) == 0 ? 0 : errno;
    close(ruleset);
    if (rc != 0) *why = "landlock_restrict_self failed";
    return rc;
}

// MARK: seccomp

#if defined(__x86_64__)
#define SECCOMP_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SECCOMP_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "sdk-host-launcher: seccomp filter for this architecture is not written"
#endif

#define LD_NR BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#define LD_ARCH BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch))
// The low and high 32 bits of an argument (both architectures are little-endian).
#define LD_ARG(i) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[i]))
#define LD_ARG_HI(i) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[i]) + 4)
#define JEQ(k, t, f) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (k), (t), (f))
#define JSET(k, t, f) BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, (k), (t), (f))
#define AND(k) BPF_STMT(BPF_ALU | BPF_AND | BPF_K, (k))
#define RET(v) BPF_STMT(BPF_RET | BPF_K, (v))
#define ALLOW RET(SECCOMP_RET_ALLOW)
#define ERRNO(e) RET(SECCOMP_RET_ERRNO | ((e) & SECCOMP_RET_DATA))

// The worker's system calls are an allow-list: a call not named here fails with EPERM, whatever it is, so a call
// nobody thought of (or one a newer kernel adds) is refused. What is here is what the Swift runtime, Dispatch,
// Foundation(Essentials), glibc's loader and the worker runtime call, and nothing that names another process,
// the machine's mounts, namespaces, keys, kernel programs or devices. Calls that could reach outside the worker
// are allowed only with argument checks (`apply_seccomp`):
//   clone        threads only (CLONE_THREAD), never new namespaces; new processes only with AllowSubprocesses
//   clone3       ENOSYS: its flags are in memory a filter cannot read; glibc falls back to clone
//   execve       only the launcher's own exec of the extension (its path pointer): the worker cannot exec again
//   kill, tgkill, rt_(tg)sigqueueinfo   the worker itself only (its pid namespace holds nothing else but init)
//   prlimit64, setpriority, sched_set*  the calling process or thread only (pid 0)
//   prctl        naming threads and memory, the parent-death signal, dumpable and no_new_privs queries
//   socket, socketpair   Unix stream and seqpacket sockets only, unless NetworkAllowed (then IPv4, IPv6, Unix
//                and netlink route sockets)
//   sendto       no address unless NetworkAllowed (a datagram with an address could reach a named socket)
//   memfd_create only with MFD_NOEXEC_SEAL: a memfd can never be executed
//   ioctl        terminal queries and FIONREAD/FIONBIO/FIOCLEX only
// Not allowed, on purpose: chmod/chown and xattr writes, inotify/fanotify, mount and namespace calls, ptrace,
// process_vm_*, pidfd_*, kcmp, bpf, perf, io_uring, userfaultfd, keyctl, System V IPC, execveat, personality
// changes, mlock, sync, and everything else not listed.
static const int allowed[] = {
    // Files and descriptors (inside the worker's own root).
    SYS_read, SYS_write, SYS_readv, SYS_writev, SYS_pread64, SYS_pwrite64, SYS_preadv, SYS_pwritev, SYS_preadv2,
    SYS_pwritev2, SYS_close, SYS_close_range, SYS_dup, SYS_dup3, SYS_fcntl, SYS_openat, SYS_openat2, SYS_lseek,
    SYS_newfstatat, SYS_fstat, SYS_statx, SYS_getdents64, SYS_getcwd, SYS_chdir, SYS_fchdir, SYS_readlinkat,
    SYS_faccessat, SYS_faccessat2, SYS_mkdirat, SYS_unlinkat, SYS_renameat, SYS_renameat2, SYS_linkat, SYS_symlinkat,
    SYS_ftruncate, SYS_truncate, SYS_fsync, SYS_fdatasync, SYS_flock, SYS_fallocate, SYS_statfs, SYS_fstatfs,
    SYS_umask, SYS_utimensat, SYS_fadvise64, SYS_readahead, SYS_sendfile, SYS_copy_file_range, SYS_splice, SYS_tee,
    SYS_getrandom,
    // Memory.
    SYS_mmap, SYS_munmap, SYS_mprotect, SYS_mremap, SYS_madvise, SYS_brk, SYS_msync, SYS_mincore, SYS_membarrier,
    // Threads, futexes, signals on itself, exit.
    SYS_futex, SYS_futex_waitv, SYS_set_robust_list, SYS_get_robust_list, SYS_set_tid_address, SYS_rseq,
    SYS_exit, SYS_exit_group, SYS_wait4, SYS_waitid, SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn,
    SYS_rt_sigsuspend, SYS_rt_sigtimedwait, SYS_rt_sigpending, SYS_sigaltstack, SYS_restart_syscall,
    SYS_sched_yield, SYS_sched_getaffinity, SYS_sched_getparam, SYS_sched_getscheduler, SYS_sched_getattr,
    SYS_sched_get_priority_max, SYS_sched_get_priority_min, SYS_getpriority, SYS_getcpu,
    // Who and where it is.
    SYS_getpid, SYS_gettid, SYS_getppid, SYS_getuid, SYS_geteuid, SYS_getgid, SYS_getegid, SYS_getgroups,
    SYS_getresuid, SYS_getresgid, SYS_getpgid, SYS_getsid, SYS_uname, SYS_sysinfo, SYS_getrusage, SYS_times,
    SYS_capget, SYS_getrlimit, SYS_setrlimit,
    // Time and timers.
    SYS_clock_gettime, SYS_clock_getres, SYS_clock_nanosleep, SYS_nanosleep, SYS_gettimeofday, SYS_getitimer,
    SYS_setitimer, SYS_timer_create, SYS_timer_settime, SYS_timer_gettime, SYS_timer_getoverrun, SYS_timer_delete,
    SYS_timerfd_create, SYS_timerfd_settime, SYS_timerfd_gettime,
    // Waiting on descriptors.
    SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_pwait, SYS_epoll_pwait2, SYS_eventfd2, SYS_pipe2, SYS_ppoll,
    SYS_pselect6, SYS_signalfd4,
    // Sockets it already has (the host connection) or may make (checked below).
    SYS_sendmsg, SYS_recvmsg, SYS_recvfrom, SYS_recvmmsg, SYS_shutdown, SYS_getsockopt, SYS_setsockopt,
    SYS_getsockname, SYS_getpeername,
#if defined(__x86_64__)
    // The older x86_64 entry points of the same calls, and the thread pointer.
    SYS_open, SYS_stat, SYS_lstat, SYS_access, SYS_pipe, SYS_dup2, SYS_poll, SYS_select, SYS_getdents, SYS_mkdir,
    SYS_rmdir, SYS_unlink, SYS_rename, SYS_link, SYS_symlink, SYS_readlink, SYS_epoll_create, SYS_epoll_wait,
    SYS_eventfd, SYS_signalfd, SYS_alarm, SYS_pause, SYS_time, SYS_getpgrp, SYS_arch_prctl,
#endif
};

#define NAMESPACE_FLAGS (CLONE_NEWNS | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC \
                         | CLONE_NEWCGROUP)

// The filter is a binary search over ranges of consecutive system call numbers that go the same way (allowed,
// or one argument check), so a call takes a handful of comparisons whatever the list's length, and the program
// stays short: the kernel converts and JIT-compiles it at every launch (~0.25 µs an instruction here) and runs
// it for every number to fill its cache of calls that are always allowed. Classic BPF's conditional jumps
// reach 255 instructions at most, so every far jump goes through an unconditional one (BPF_JA, 32-bit offset):
// a leaf tests its ranges in order and falls into a one-instruction `JA label` or `RET`; an inner node tests
// `nr >= middle` and either falls into `JA right` or skips it into its left half. `resolve` patches the JA
// offsets once every label has a position.

enum { MAX_INSNS = 1024, MAX_RULES = 256, MAX_JUMPS = 512, MAX_LABELS = 192 };

struct filter {
    struct sock_filter insns[MAX_INSNS + 1];
    unsigned count;
    int overflow;
    int label_at[MAX_LABELS];  // instruction index of each label, -1 until placed
    unsigned labels;
    struct { unsigned insn; int label; } jumps[MAX_JUMPS];  // JA instructions to patch
    unsigned jump_count;
};

/// A rule: a system call number and where it goes (`label`), or -1 for "allowed as it is".
struct rule { unsigned nr; int label; };
/// Consecutive numbers `first...last` that go the same way.
struct range { unsigned first, last; int label; };

static void emit(struct filter *f, struct sock_filter insn) {
    if (f->count >= MAX_INSNS) { f->overflow = 1; return; }
    f->insns[f->count++] = insn;
}

static void emit_all(struct filter *f, const struct sock_filter *insns, unsigned n) {
    for (unsigned i = 0; i < n; i++) emit(f, insns[i]);
}

static int new_label(struct filter *f) {
    if (f->labels >= MAX_LABELS) { f->overflow = 1; return 0; }
    f->label_at[f->labels] = -1;
    return (int)f->labels++;
}

static void place(struct filter *f, int label) { f->label_at[label] = (int)f->count; }

/// An unconditional jump to `label`.
static void jump_to(struct filter *f, int label) {
    if (f->jump_count >= MAX_JUMPS) { f->overflow = 1; return; }
    f->jumps[f->jump_count].insn = f->count;
    f->jumps[f->jump_count].label = label;
    f->jump_count++;
    emit(f, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JA, 0, 0, 0));
}

static int resolve(struct filter *f) {
    for (unsigned i = 0; i < f->jump_count; i++) {
        int target = f->label_at[f->jumps[i].label];
        int offset = target - (int)f->jumps[i].insn - 1;
        if (target < 0 || offset < 0) return -1;
        f->insns[f->jumps[i].insn].k = (unsigned)offset;
    }
    return f->overflow ? -1 : 0;
}

static void emit_action(struct filter *f, int label) {
    if (label < 0) emit(f, (struct sock_filter)ALLOW);
    else jump_to(f, label);
}

/// Ranges lo..<hi (ascending). Up to four ranges are a chain: a number past a range's last goes on to the next,
/// one at or past its first takes its way, and the rest (between ranges) is refused with EPERM; so is a number
/// past them all. A one-number range is a single equality test.
static void emit_search(struct filter *f, const struct range *ranges, unsigned lo, unsigned hi) {
    if (hi - lo <= 4) {
        for (unsigned i = lo; i < hi; i++) {
            const struct range *r = &ranges[i];
            if (r->first == r->last) {
                emit(f, (struct sock_filter)JEQ(r->first, 0, 1));
            } else {
                // past it: skip this range's two remaining instructions; below it: refused (the next range
                // starts higher still), by a jump over the rest of the chain to its EPERM.
                unsigned rest = 0;
                for (unsigned j = i + 1; j < hi; j++) rest += ranges[j].first == ranges[j].last ? 2 : 3;
                emit(f, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, r->last, 2, 0));
                emit(f, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, r->first, 0, (unsigned char)(rest + 1)));
            }
            emit_action(f, r->label);
        }
        emit(f, (struct sock_filter)ERRNO(EPERM));
        return;
    }
    unsigned mid = lo + (hi - lo) / 2;
    int right = new_label(f);
    emit(f, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, ranges[mid].first, 0, 1));
    jump_to(f, right);
    emit_search(f, ranges, lo, mid);
    place(f, right);
    emit_search(f, ranges, mid, hi);
}

static int compare_rules(const struct rule *a, const struct rule *b) { return a->nr < b->nr ? -1 : a->nr > b->nr; }

#define MFD_NOEXEC_SEAL_FLAG 0x0008U
#define MFD_EXEC_FLAG 0x0010U

int apply_seccomp(const struct profile *p, pid_t self, const char **why) {
    static struct filter f;
    memset(&f, 0, sizeof f);
    static struct rule rules[MAX_RULES];
    unsigned count = 0;
    int enosys = new_label(&f), personality = new_label(&f), clone = new_label(&f), to_self = new_label(&f);
    int kill = new_label(&f), pid_zero = new_label(&f), prio = new_label(&f), prctl_check = new_label(&f);
    int socket = new_label(&f), socketpair = new_label(&f), sendto = new_label(&f), memfd = new_label(&f);
    int execve = new_label(&f), ioctl = new_label(&f);
#define RULE(n, l) do { if (count < MAX_RULES) rules[count++] = (struct rule){(unsigned)(n), (l)}; else f.overflow = 1; } while (0)
    for (unsigned i = 0; i < sizeof allowed / sizeof allowed[0]; i++) RULE(allowed[i], -1);
    RULE(SYS_clone3, enosys);
    RULE(SYS_personality, personality);
    RULE(SYS_clone, clone);
    RULE(SYS_kill, kill);
    RULE(SYS_tgkill, to_self);
    RULE(SYS_rt_sigqueueinfo, to_self);
    RULE(SYS_rt_tgsigqueueinfo, to_self);
    RULE(SYS_prlimit64, pid_zero);
    RULE(SYS_sched_setaffinity, pid_zero);
    RULE(SYS_sched_setparam, pid_zero);
    RULE(SYS_sched_setscheduler, pid_zero);
    RULE(SYS_sched_setattr, pid_zero);
    RULE(SYS_setpriority, prio);
    RULE(SYS_prctl, prctl_check);
    RULE(SYS_socket, socket);
    RULE(SYS_socketpair, socketpair);
    RULE(SYS_sendto, sendto);
    RULE(SYS_memfd_create, memfd);
    // With AllowSubprocesses the extension may run programs (Landlock still lets it execute only its own
    // executable and the runtime folders); without, only the launcher's own exec.
    RULE(SYS_execve, p->subprocesses ? -1 : execve);
    if (p->subprocesses) RULE(SYS_execveat, -1);
    RULE(SYS_ioctl, ioctl);
    if (p->subprocesses) {
#if defined(__x86_64__)
        RULE(SYS_fork, -1);
        RULE(SYS_vfork, -1);
#endif
        RULE(SYS_setpgid, -1);
    }
    if (p->network) {
        RULE(SYS_connect, -1);
        RULE(SYS_bind, -1);
        RULE(SYS_listen, -1);
        RULE(SYS_accept, -1);
        RULE(SYS_accept4, -1);
        RULE(SYS_sendmmsg, -1);
    }
#undef RULE
    // Insertion sort: a few hundred numbers, and the launcher has no qsort. A number listed twice would make
    // the search ambiguous: refuse to build such a filter.
    for (unsigned i = 1; i < count; i++) {
        struct rule r = rules[i];
        unsigned j = i;
        for (; j > 0 && compare_rules(&rules[j - 1], &r) > 0; j--) rules[j] = rules[j - 1];
        rules[j] = r;
    }
    for (unsigned i = 1; i < count; i++)
        if (rules[i].nr == rules[i - 1].nr) f.overflow = 1;
    // Runs of consecutive numbers that go the same way become one range.
    static struct range ranges[MAX_RULES];
    unsigned range_count = 0;
    for (unsigned i = 0; i < count; i++) {
        struct range *last = range_count ? &ranges[range_count - 1] : NULL;
        if (last && last->label == rules[i].label && last->last + 1 == rules[i].nr) last->last = rules[i].nr;
        else ranges[range_count++] = (struct range){rules[i].nr, rules[i].nr, rules[i].label};
    }

    // Another architecture's calls (an i386 int 0x80, for one) would be read with the wrong numbers, and x32
    // calls alias x86_64 ones: both kill the process (SIGSYS), as returning to such code is not safe.
    emit(&f, (struct sock_filter)LD_ARCH);
    emit(&f, (struct sock_filter)JEQ(SECCOMP_AUDIT_ARCH, 1, 0));
    emit(&f, (struct sock_filter)RET(SECCOMP_RET_KILL_PROCESS));
    emit(&f, (struct sock_filter)LD_NR);
#if defined(__x86_64__)
    emit(&f, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1));
    emit(&f, (struct sock_filter)RET(SECCOMP_RET_KILL_PROCESS));
#endif
    emit_search(&f, ranges, 0, range_count);

    place(&f, enosys);
    emit(&f, (struct sock_filter)ERRNO(ENOSYS));
    // personality: the query alone (0xffffffff); setting a persona (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE) no.
    place(&f, personality);
    struct sock_filter personality_check[] = {LD_ARG(0), JEQ(0xffffffffU, 0, 1), ALLOW, ERRNO(EPERM)};
    emit_all(&f, personality_check, 4);
    place(&f, clone);
    if (p->subprocesses) {
        // New processes, but not in new namespaces.
        struct sock_filter check[] = {LD_ARG(0), JSET(NAMESPACE_FLAGS, 0, 1), ERRNO(EPERM), ALLOW};
        emit_all(&f, check, 4);
    } else {
        // Threads only: a clone without CLONE_THREAD is a new process. (A thread clone with namespace flags
        // is EINVAL in the kernel.)
        struct sock_filter check[] = {LD_ARG(0), JSET(CLONE_THREAD, 0, 1), ALLOW, ERRNO(EPERM)};
        emit_all(&f, check, 4);
    }
    // kill: itself, or its own process group (0). With AllowSubprocesses, its children too: they are in its pid
    // namespace, where nothing else lives but init.
    place(&f, kill);
    if (p->subprocesses) {
        struct sock_filter check[] = {LD_ARG(0), JEQ(1, 0, 1), ERRNO(EPERM), ALLOW};
        emit_all(&f, check, 4);
    } else {
        struct sock_filter check[] = {LD_ARG(0), JEQ((unsigned)self, 2, 0), JEQ(0, 1, 0), ERRNO(EPERM), ALLOW};
        emit_all(&f, check, 5);
    }
    // tgkill, rt_sigqueueinfo and rt_tgsigqueueinfo: the first argument is the target process.
    place(&f, to_self);
    if (p->subprocesses) {
        struct sock_filter check[] = {LD_ARG(0), JEQ(1, 0, 1), ERRNO(EPERM), ALLOW};
        emit_all(&f, check, 4);
    } else {
        struct sock_filter check[] = {LD_ARG(0), JEQ((unsigned)self, 0, 1), ALLOW, ERRNO(EPERM)};
        emit_all(&f, check, 4);
    }
    // prlimit64 and sched_set*: pid 0, the caller (prlimit64 also with its own pid).
    place(&f, pid_zero);
    struct sock_filter zero_check[] = {LD_ARG(0), JEQ(0, 1, 0), JEQ((unsigned)self, 0, 1), ALLOW, ERRNO(EPERM)};
    emit_all(&f, zero_check, 5);
    // setpriority(PRIO_PROCESS, 0, ...): the calling thread only.
    place(&f, prio);
    struct sock_filter prio_check[] = {LD_ARG(0), JEQ(PRIO_PROCESS, 0, 3), LD_ARG(1), JEQ(0, 0, 1), ALLOW,
                                       ERRNO(EPERM)};
    emit_all(&f, prio_check, 6);
    place(&f, prctl_check);
    struct sock_filter prctl_checks[] = {
        LD_ARG(0),
        JEQ(PR_SET_PDEATHSIG, 9, 0), JEQ(PR_GET_PDEATHSIG, 8, 0), JEQ(PR_GET_DUMPABLE, 7, 0),
        JEQ(PR_SET_NAME, 6, 0), JEQ(PR_GET_NAME, 5, 0), JEQ(PR_GET_NO_NEW_PRIVS, 4, 0),
        JEQ(PR_SET_NO_NEW_PRIVS, 3, 0), JEQ(PR_GET_SECCOMP, 2, 0), JEQ(0x53564d41 /* PR_SET_VMA */, 1, 0),
        ERRNO(EPERM), ALLOW,
    };
    emit_all(&f, prctl_checks, sizeof prctl_checks / sizeof prctl_checks[0]);
    place(&f, socket);
    if (p->network) {
        struct sock_filter check[] = {LD_ARG(0), JEQ(AF_UNIX, 5, 0), JEQ(AF_INET, 4, 0), JEQ(AF_INET6, 3, 0),
                                      JEQ(AF_NETLINK, 0, 3), LD_ARG(2), JEQ(0 /* NETLINK_ROUTE */, 0, 1), ALLOW,
                                      ERRNO(EPERM)};
        emit_all(&f, check, 9);
        place(&f, socketpair);
        struct sock_filter pair_check[] = {LD_ARG(0), JEQ(AF_UNIX, 0, 1), ALLOW, ERRNO(EPERM)};
        emit_all(&f, pair_check, 4);
    } else {
        // socket and socketpair alike: Unix stream or seqpacket sockets only. They cannot carry an address, and
        // connect, bind and listen are refused, so no named or abstract socket can be reached or offered.
        place(&f, socketpair);
        struct sock_filter check[] = {LD_ARG(0), JEQ(AF_UNIX, 0, 5), LD_ARG(1),
                                      AND(~(unsigned)(SOCK_NONBLOCK | SOCK_CLOEXEC)),
                                      JEQ(SOCK_STREAM, 1, 0), JEQ(SOCK_SEQPACKET, 0, 1), ALLOW, ERRNO(EPERM)};
        emit_all(&f, check, 8);
    }
    // sendto with an address (its fifth argument) is a datagram to somewhere: only with NetworkAllowed.
    place(&f, sendto);
    if (p->network) {
        emit(&f, (struct sock_filter)ALLOW);
    } else {
        struct sock_filter check[] = {LD_ARG(4), JEQ(0, 0, 3), LD_ARG_HI(4), JEQ(0, 0, 1), ALLOW, ERRNO(EPERM)};
        emit_all(&f, check, 6);
    }
    // memfd_create: sealed against execution from birth, and never with MFD_EXEC.
    place(&f, memfd);
    struct sock_filter memfd_check[] = {LD_ARG(1), JSET(MFD_EXEC_FLAG, 2, 0), JSET(MFD_NOEXEC_SEAL_FLAG, 0, 1),
                                        ALLOW, ERRNO(EPERM)};
    emit_all(&f, memfd_check, 5);
    // execve: only the launcher's own, with the profile's path pointer (the extension's image replaces the
    // launcher's, so the worker has no way to hold that pointer but to map memory at it on purpose; even then
    // Landlock lets it execute only its own executable and the runtime folders).
    place(&f, execve);
    uint64_t path = (uint64_t)(uintptr_t)p->executable;
    struct sock_filter exec_check[] = {LD_ARG(0), JEQ((uint32_t)path, 0, 3), LD_ARG_HI(0), JEQ((uint32_t)(path >> 32), 0, 1),
                                       ALLOW, ERRNO(EPERM)};
    emit_all(&f, exec_check, 6);
    // ioctl: what isatty, terminal size and descriptor flags need.
    place(&f, ioctl);
    struct sock_filter ioctl_checks[] = {
        LD_ARG(1),
        JEQ(TCGETS, 5, 0), JEQ(TIOCGWINSZ, 4, 0), JEQ(FIONREAD, 3, 0), JEQ(FIONBIO, 2, 0), JEQ(FIOCLEX, 1, 0),
        ERRNO(ENOTTY), ALLOW,
    };
    emit_all(&f, ioctl_checks, sizeof ioctl_checks / sizeof ioctl_checks[0]);
    if (resolve(&f) != 0) {
        *why = "seccomp filter does not fit in classic BPF";
        return E2BIG;
    }
    struct sock_fprog program = {.len = (unsigned short)f.count, .filter = f.insns};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program) != 0) {
        *why = "seccomp(SECCOMP_SET_MODE_FILTER) failed";
        return errno;
    }
    return 0;
}

// MARK: Capabilities

int drop_capabilities(const char **why) {
    // A root launcher locks root out of capabilities: an exec as uid 0 grants none (NOROOT), a change of uid
    // does not restore them (NO_SETUID_FIXUP), and none can be raised as ambient. An unprivileged launcher
    // cannot set these bits (no CAP_SETPCAP) and has nothing to lock: it goes on.
    unsigned long bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED
        | SECBIT_KEEP_CAPS_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    if (prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) != 0 && errno != EPERM) {
        *why = "prctl(PR_SET_SECUREBITS) failed";
        return errno;
    }
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    // Empty effective, permitted and inheritable sets. With no_new_privs (set before this), no exec can add to
    // an empty permitted set: not a set-user-ID file, not file capabilities, not uid 0. The bounding set is
    // left as it is: it only bounds what an exec could grant, and one PR_CAPBSET_DROP per capability cost
    // ~60 us of every sandboxed cold start.
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &header, data) != 0) {
        *why = "capset failed";
        return errno;
    }
    return 0;
}
