// Landlock, seccomp and capabilities for the launcher (see sandbox.h and README "Sandbox").
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

// The filter is a binary search over the system call numbers that are not simply allowed, so a call takes a
// handful of comparisons, whatever the list's length. That matters most when the filter is installed: the kernel
// runs it for every system call number to cache the always-allowed ones, and with one chain of comparisons that
// took ~90 us of each cold start (~2 us per instruction). Jumps are forward only, with 8-bit offsets: leaves
// and inner nodes are emitted first, each naming its target by label, and the targets (one return for each
// outcome, and the argument checks) follow; `resolve` patches the offsets once every label has a position.

enum { MAX_INSNS = 255, MAX_RULES = 96, MAX_JUMPS = 192, MAX_LABELS = 96 };

struct filter {
    struct sock_filter insns[MAX_INSNS + 1];
    unsigned count;
    int overflow;
    int label_at[MAX_LABELS];  // instruction index of each label, -1 until placed
    unsigned labels;
    struct { unsigned insn; int label; } jumps[MAX_JUMPS];  // conditional jumps: true branch to `label`
    unsigned jump_count;
};

struct rule { unsigned nr; int label; };

static void emit(struct filter *f, struct sock_filter insn) {
    if (f->count >= MAX_INSNS) { f->overflow = 1; return; }
    f->insns[f->count++] = insn;
}

static int new_label(struct filter *f) {
    if (f->labels >= MAX_LABELS) { f->overflow = 1; return 0; }
    f->label_at[f->labels] = -1;
    return (int)f->labels++;
}

static void place(struct filter *f, int label) { f->label_at[label] = (int)f->count; }

/// A conditional jump whose true branch goes to `label` and whose false branch falls through.
static void jump_if(struct filter *f, unsigned short op, unsigned k, int label) {
    if (f->jump_count >= MAX_JUMPS) { f->overflow = 1; return; }
    f->jumps[f->jump_count].insn = f->count;
    f->jumps[f->jump_count].label = label;
    f->jump_count++;
    emit(f, (struct sock_filter)BPF_JUMP(BPF_JMP | op | BPF_K, k, 0, 0));
}

static int resolve(struct filter *f) {
    for (unsigned i = 0; i < f->jump_count; i++) {
        int target = f->label_at[f->jumps[i].label];
        int offset = target - (int)f->jumps[i].insn - 1;
        if (target < 0 || offset < 0 || offset > 255) return -1;
        f->insns[f->jumps[i].insn].jt = (unsigned char)offset;
    }
    return f->overflow ? -1 : 0;
}

/// Rules lo..<hi (sorted by number): a number below the middle rule's goes left, the others right. Up to three
/// rules are a chain of equality tests; a number that matches none is allowed.
static void emit_search(struct filter *f, const struct rule *rules, unsigned lo, unsigned hi) {
    if (hi - lo <= 3) {
        for (unsigned i = lo; i < hi; i++) jump_if(f, BPF_JEQ, rules[i].nr, rules[i].label);
        emit(f, (struct sock_filter)ALLOW);
        return;
    }
    unsigned mid = lo + (hi - lo) / 2;
    int right = new_label(f);
    jump_if(f, BPF_JGE, rules[mid].nr, right);
    emit_search(f, rules, lo, mid);
    place(f, right);
    emit_search(f, rules, mid, hi);
}

static int compare_rules(const struct rule *a, const struct rule *b) { return a->nr < b->nr ? -1 : a->nr > b->nr; }

int apply_seccomp(const struct profile *p, pid_t self, const char **why) {
    static struct filter f;
    memset(&f, 0, sizeof f);
    struct rule rules[MAX_RULES];
    unsigned count = 0;
    int eperm = new_label(&f), enosys = new_label(&f), personality = new_label(&f), clone = new_label(&f);
    int kill = new_label(&f), to_self = new_label(&f), socket = new_label(&f), socketpair = new_label(&f);
#define RULE(n, l) do { if (count < MAX_RULES) rules[count++] = (struct rule){(unsigned)(n), (l)}; else f.overflow = 1; } while (0)
    for (unsigned i = 0; i < sizeof denied / sizeof denied[0]; i++) RULE(denied[i], eperm);
    // clone3 passes its flags in memory a filter cannot read: ENOSYS makes glibc fall back to clone.
    RULE(SYS_clone3, enosys);
    RULE(SYS_personality, personality);
    RULE(SYS_clone, clone);
    RULE(SYS_socket, socket);
    if (!p->subprocesses) {
#if defined(__x86_64__)
        RULE(SYS_fork, eperm);
        RULE(SYS_vfork, eperm);
#endif
        RULE(SYS_tkill, eperm);
        RULE(SYS_pidfd_send_signal, eperm);
        RULE(SYS_kill, kill);
        RULE(SYS_tgkill, to_self);
        RULE(SYS_rt_sigqueueinfo, to_self);
        RULE(SYS_rt_tgsigqueueinfo, to_self);
    }
    if (!p->network) {
        // No way to reach a named or abstract Unix socket, or to offer one (socket() is checked below).
        RULE(SYS_connect, eperm);
        RULE(SYS_bind, eperm);
        RULE(SYS_listen, eperm);
        RULE(SYS_accept, eperm);
        RULE(SYS_accept4, eperm);
        RULE(SYS_socketpair, socketpair);
    }
#undef RULE
    // Insertion sort: a few dozen numbers, and the launcher has no qsort.
    for (unsigned i = 1; i < count; i++) {
        struct rule r = rules[i];
        unsigned j = i;
        for (; j > 0 && compare_rules(&rules[j - 1], &r) > 0; j--) rules[j] = rules[j - 1];
        rules[j] = r;
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
    emit_search(&f, rules, 0, count);

    place(&f, eperm);
    emit(&f, (struct sock_filter)ERRNO(EPERM));
    place(&f, enosys);
    emit(&f, (struct sock_filter)ERRNO(ENOSYS));
    // personality: the query alone (0xffffffff); setting a persona (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE) no.
    place(&f, personality);
    struct sock_filter personality_check[] = {LD_ARG(0), JEQ(0xffffffffU, 0, 1), ALLOW, ERRNO(EPERM)};
    for (unsigned i = 0; i < 4; i++) emit(&f, personality_check[i]);
    place(&f, clone);
    if (p->subprocesses) {
        // New processes, but not in new namespaces.
        struct sock_filter check[] = {LD_ARG(0), JSET(NAMESPACE_FLAGS, 0, 1), ERRNO(EPERM), ALLOW};
        for (unsigned i = 0; i < 4; i++) emit(&f, check[i]);
    } else {
        // Threads only: a clone without CLONE_THREAD is a new process. (A thread clone with namespace flags
        // is EINVAL in the kernel.)
        struct sock_filter check[] = {LD_ARG(0), JSET(CLONE_THREAD, 0, 1), ALLOW, ERRNO(EPERM)};
        for (unsigned i = 0; i < 4; i++) emit(&f, check[i]);
        // Signals reach the worker itself and nothing else: it has no children, and the host's pid is in
        // plain sight (Landlock's signal scope says the same from ABI 6 on; this holds on older kernels too).
        place(&f, kill);
        struct sock_filter kill_check[] = {LD_ARG(0), JEQ((unsigned)self, 2, 0), JEQ(0, 1, 0), ERRNO(EPERM), ALLOW};
        for (unsigned i = 0; i < 5; i++) emit(&f, kill_check[i]);
        // tgkill, rt_sigqueueinfo and rt_tgsigqueueinfo: the first argument is the target process.
        place(&f, to_self);
        struct sock_filter self_check[] = {LD_ARG(0), JEQ((unsigned)self, 0, 1), ALLOW, ERRNO(EPERM)};
        for (unsigned i = 0; i < 4; i++) emit(&f, self_check[i]);
    }
    place(&f, socket);
    if (p->network) {
        struct sock_filter check[] = {LD_ARG(0), JEQ(AF_UNIX, 5, 0), JEQ(AF_INET, 4, 0), JEQ(AF_INET6, 3, 0),
                                      JEQ(AF_NETLINK, 0, 3), LD_ARG(2), JEQ(0 /* NETLINK_ROUTE */, 0, 1), ALLOW,
                                      ERRNO(EPERM)};
        for (unsigned i = 0; i < 9; i++) emit(&f, check[i]);
    } else {
        // Unix stream sockets only, and no way to reach a named or abstract one: connect, bind and listen are
        // refused (above). Socket pairs of any type work (the host connection is one).
        struct sock_filter check[] = {LD_ARG(0), JEQ(AF_UNIX, 0, 4), LD_ARG(1),
                                      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~(unsigned)(SOCK_NONBLOCK | SOCK_CLOEXEC)),
                                      JEQ(SOCK_STREAM, 0, 1), ALLOW, ERRNO(EPERM)};
        for (unsigned i = 0; i < 7; i++) emit(&f, check[i]);
        place(&f, socketpair);
        struct sock_filter pair_check[] = {LD_ARG(0), JEQ(AF_UNIX, 0, 1), ALLOW, ERRNO(EPERM)};
        for (unsigned i = 0; i < 4; i++) emit(&f, pair_check[i]);
    }
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
