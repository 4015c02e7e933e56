// Landlock, seccomp and capabilities for the launcher (see sandbox.h and README "Sandbox").
#define _GNU_SOURCE
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

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

static void note(char *skipped, size_t size, const char *path, int error) {
    size_t used = strlen(skipped);
    if (used + 2 >= size) return;
    snprintf(skipped + used, size - used, "%s%s (%s)", used ? ", " : "", path, strerror(error));
}

static int add_paths(int ruleset, const struct paths *list, uint64_t access, uint64_t handled, char *skipped,
                     size_t skipped_size) {
    for (size_t i = 0; i < list->count; i++) {
        int fd = open(list->items[i], O_PATH | O_CLOEXEC);
        if (fd < 0) {
            note(skipped, skipped_size, list->items[i], errno);
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
    int rc = add_paths(ruleset, &p->executable_paths, LL_FS_EXECUTE | read, handled, skipped, skipped_size);
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
// The low 32 bits of an argument (both architectures are little-endian).
#define LD_ARG(i) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[i]))
#define JEQ(k, t, f) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (k), (t), (f))
#define JSET(k, t, f) BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, (k), (t), (f))
#define RET(v) BPF_STMT(BPF_RET | BPF_K, (v))
#define ALLOW RET(SECCOMP_RET_ALLOW)
#define ERRNO(e) RET(SECCOMP_RET_ERRNO | ((e) & SECCOMP_RET_DATA))

/// Calls no worker needs, refused with EPERM: debugging and memory access across processes, mounts and
/// namespaces, kernel programs and keys, kernel and module loading, and other host-wide switches.
static const int denied[] = {
    SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_pidfd_getfd, SYS_kcmp, SYS_process_madvise,
    SYS_mount, SYS_umount2, SYS_pivot_root, SYS_chroot, SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_fspick,
    SYS_move_mount, SYS_open_tree, SYS_mount_setattr, SYS_open_by_handle_at, SYS_name_to_handle_at,
    SYS_unshare, SYS_setns, SYS_bpf, SYS_perf_event_open, SYS_io_uring_setup, SYS_io_uring_enter,
    SYS_io_uring_register, SYS_userfaultfd, SYS_keyctl, SYS_add_key, SYS_request_key, SYS_kexec_load,
    SYS_kexec_file_load, SYS_init_module, SYS_finit_module, SYS_delete_module, SYS_reboot, SYS_swapon,
    SYS_swapoff, SYS_acct, SYS_syslog, SYS_quotactl, SYS_vhangup,
#if defined(__x86_64__)
    SYS_iopl, SYS_ioperm, SYS_uselib,
#endif
};

#define NAMESPACE_FLAGS (CLONE_NEWNS | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC \
                         | CLONE_NEWCGROUP)

int apply_seccomp(const struct profile *p, pid_t self, const char **why) {
    struct sock_filter f[256];
    unsigned n = 0;
#define EMIT(...)                                                                          \
    do {                                                                                   \
        struct sock_filter block[] = {__VA_ARGS__};                                        \
        for (unsigned i_ = 0; i_ < sizeof block / sizeof block[0]; i_++) f[n++] = block[i_]; \
    } while (0)

    // Another architecture's calls (an i386 int 0x80, for one) would be read with the wrong numbers, and x32
    // calls alias x86_64 ones: both kill the process (SIGSYS), as returning to such code is not safe.
    EMIT(LD_ARCH, JEQ(SECCOMP_AUDIT_ARCH, 1, 0), RET(SECCOMP_RET_KILL_PROCESS), LD_NR);
#if defined(__x86_64__)
    EMIT(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1), RET(SECCOMP_RET_KILL_PROCESS));
#endif
    // Every call refused outright, as one chain of comparisons that all jump to one shared EPERM: half the
    // instructions of a return after each. Installing a filter costs time in proportion to its length (the
    // kernel runs it for every system call number to build its cache of always-allowed calls), and so does
    // every call the worker makes that is not in the list.
    int refused[sizeof denied / sizeof denied[0] + 16];
    unsigned count = 0;
    for (unsigned i = 0; i < sizeof denied / sizeof denied[0]; i++) refused[count++] = denied[i];
    if (!p->subprocesses) {
#if defined(__x86_64__)
        refused[count++] = SYS_fork;
        refused[count++] = SYS_vfork;
#endif
        refused[count++] = SYS_tkill;
        refused[count++] = SYS_pidfd_send_signal;
    }
    if (!p->network) {
        // No way to reach a named or abstract Unix socket, or to offer one (socket() is checked below).
        refused[count++] = SYS_connect;
        refused[count++] = SYS_bind;
        refused[count++] = SYS_listen;
        refused[count++] = SYS_accept;
        refused[count++] = SYS_accept4;
    }
    for (unsigned i = 0; i < count; i++) EMIT(JEQ((unsigned)refused[i], (unsigned char)(count - i), 0));
    EMIT(BPF_JUMP(BPF_JMP | BPF_JA | BPF_K, 1, 0, 0), ERRNO(EPERM));
    // clone3 passes its flags in memory a filter cannot read: ENOSYS makes glibc fall back to clone.
    EMIT(JEQ(SYS_clone3, 0, 1), ERRNO(ENOSYS));
    // personality: the query alone (0xffffffff); setting a persona (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE) no.
    EMIT(JEQ(SYS_personality, 0, 4), LD_ARG(0), JEQ(0xffffffffU, 0, 1), ALLOW, ERRNO(EPERM));
    if (p->subprocesses) {
        // New processes, but not in new namespaces.
        EMIT(JEQ(SYS_clone, 0, 4), LD_ARG(0), JSET(NAMESPACE_FLAGS, 0, 1), ERRNO(EPERM), ALLOW);
    } else {
        // Threads only: a clone without CLONE_THREAD is a new process. (A thread clone with namespace flags
        // is EINVAL in the kernel.)
        EMIT(JEQ(SYS_clone, 0, 4), LD_ARG(0), JSET(CLONE_THREAD, 1, 0), ERRNO(EPERM), ALLOW);
        // Signals reach the worker itself and nothing else: it has no children, and the host's pid is in
        // plain sight (Landlock's signal scope says the same from ABI 6 on; this holds on older kernels too).
        EMIT(JEQ(SYS_kill, 0, 5), LD_ARG(0), JEQ((unsigned)self, 2, 0), JEQ(0, 1, 0), ERRNO(EPERM), ALLOW);
        EMIT(JEQ(SYS_tgkill, 0, 4), LD_ARG(0), JEQ((unsigned)self, 1, 0), ERRNO(EPERM), ALLOW);
        EMIT(JEQ(SYS_rt_sigqueueinfo, 0, 4), LD_ARG(0), JEQ((unsigned)self, 1, 0), ERRNO(EPERM), ALLOW);
        EMIT(JEQ(SYS_rt_tgsigqueueinfo, 0, 4), LD_ARG(0), JEQ((unsigned)self, 1, 0), ERRNO(EPERM), ALLOW);
    }
    if (p->network) {
        EMIT(JEQ(SYS_socket, 0, 9), LD_ARG(0), JEQ(AF_UNIX, 5, 0), JEQ(AF_INET, 4, 0), JEQ(AF_INET6, 3, 0),
             JEQ(AF_NETLINK, 0, 3), LD_ARG(2), JEQ(0 /* NETLINK_ROUTE */, 0, 1), ALLOW, ERRNO(EPERM));
    } else {
        // Unix stream sockets only, and no way to reach a named or abstract one: connect, bind and listen are
        // refused (in the chain above). Socket pairs of any type work (the host connection is one).
        EMIT(JEQ(SYS_socket, 0, 7), LD_ARG(0), JEQ(AF_UNIX, 0, 4), LD_ARG(1),
             BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~(unsigned)(SOCK_NONBLOCK | SOCK_CLOEXEC)),
             JEQ(SOCK_STREAM, 0, 1), ALLOW, ERRNO(EPERM));
        EMIT(JEQ(SYS_socketpair, 0, 4), LD_ARG(0), JEQ(AF_UNIX, 0, 1), ALLOW, ERRNO(EPERM));
    }
    EMIT(ALLOW);
#undef EMIT
    struct sock_fprog program = {.len = (unsigned short)n, .filter = f};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program) != 0) {
        *why = "seccomp(SECCOMP_SET_MODE_FILTER) failed";
        return errno;
    }
    return 0;
}

// MARK: Capabilities

int drop_capabilities(const char **why) {
    for (int cap = 0; cap < 64; cap++) {
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0) continue;
        if (errno == EINVAL) break;  // past the last capability this kernel knows
        if (errno == EPERM) break;   // no CAP_SETPCAP: an unprivileged process; checked below
        *why = "prctl(PR_CAPBSET_DROP) failed";
        return errno;
    }
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &header, data) != 0) {
        *why = "capset failed";
        return errno;
    }
    return 0;
}
