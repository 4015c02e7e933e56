// `sdk-host-launcher --doctor`: tries each layer in a throwaway child and prints one line per layer:
// "<layer>\t<yes|no>\t<detail>". `sdk-host doctor` formats these.
#define _GNU_SOURCE
#include "sandbox.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/mount.h>

typedef int (*trial)(void);

/// Runs `body` in a forked child and returns its result: 0 for success, else an errno value.
static int in_child(trial body) {
    pid_t pid = fork();
    if (pid < 0) return errno;
    if (pid == 0) _exit(body() & 0xFF);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return errno;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return EFAULT;
}

static int namespace_trial(int flag) {
    int flags = flag | (geteuid() != 0 && flag != CLONE_NEWUSER ? CLONE_NEWUSER : 0);
    if (unshare(flags) != 0) return errno;
    if (flag != CLONE_NEWPID) return 0;
    pid_t init = fork();  // a pid namespace is only real once it has a pid 1
    if (init < 0) return errno;
    if (init == 0) _exit(getpid() == 1 ? 0 : EINVAL);
    int status;
    waitpid(init, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : EFAULT;
}
static int user_ns(void) { return namespace_trial(CLONE_NEWUSER); }
static int pid_ns(void) { return namespace_trial(CLONE_NEWPID); }
static int mount_ns(void) { return namespace_trial(CLONE_NEWNS); }
static int net_ns(void) { return namespace_trial(CLONE_NEWNET); }
/// A tmpfs mounted in a new mount namespace (in a user namespace when not root): what the worker's root needs.
static int root_trial(void) {
    int flags = CLONE_NEWNS | (geteuid() != 0 ? CLONE_NEWUSER : 0);
    if (unshare(flags) != 0) return errno;
    if (syscall(SYS_mount, NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return errno;
    return syscall(SYS_mount, "sdk-host-root", "/tmp", "tmpfs", 0, "size=64k") == 0 ? 0 : errno;
}
static int no_new_privs(void) { return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 ? 0 : errno; }
static int seccomp_trial(void) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno;
    struct profile p = {0};
    const char *why;
    return apply_seccomp(&p, getpid(), &why);
}
static int landlock_trial(void) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno;
    struct profile p = {0};
    const char *why;
    int abi;
    char skipped[64] = "";
    return apply_landlock(&p, &abi, skipped, sizeof skipped, &why);
}
static int rlimit_trial(void) {
    struct rlimit limit = {.rlim_cur = (rlim_t)1 << 40, .rlim_max = (rlim_t)1 << 40};
    return setrlimit(RLIMIT_AS, &limit) == 0 ? 0 : errno;
}
static int capabilities_trial(void) {
    const char *why;
    return drop_capabilities(&why);
}

static void report(const char *layer, int error, const char *detail) {
    if (error == 0) dprintf(1, "%s\tyes\t%s\n", layer, detail);
    else dprintf(1, "%s\tno\t%s (%s)\n", layer, strerror(error), detail);
}

int doctor(void) {
    int root = geteuid() == 0;
    report("userNamespace", in_child(user_ns),
           root ? "every worker: its ids mapped one-to-one to WorkerUser's" : "every worker: its ids mapped one-to-one");
    report("pidNamespace", in_child(pid_ns), "every worker: no other process can be named");
    report("mountNamespace", in_child(mount_ns), "every worker: a root of its own");
    report("root", in_child(root_trial), "every worker: a read-only root holding only its grants, pivot_root");
    report("netNamespace", in_child(net_ns), "every worker without NetworkAllowed: no interface, no machine socket");
    report("noNewPrivs", in_child(no_new_privs), "required by Landlock and seccomp");
    report("capabilities", in_child(capabilities_trial), "every capability dropped before exec");
    int abi = landlock_abi();
    char detail[256];
    if (abi > 0) {
        snprintf(detail, sizeof detail, "ABI %d: files%s%s%s%s%s", abi, abi >= 2 ? ", refer" : "",
                 abi >= 3 ? ", truncate" : "", abi >= 4 ? ", TCP bind and connect" : "",
                 abi >= 5 ? ", device ioctl" : "", abi >= 6 ? ", abstract Unix sockets and signals scoped" : "");
        report("landlock", in_child(landlock_trial), detail);
    } else {
        report("landlock", -abi, "no file confinement");
    }
    report("seccomp", in_child(seccomp_trial), "system call allow-list (BPF): every call not listed is refused");
    report("rlimits", in_child(rlimit_trial), "address space, file size, core files, descriptors");
    return 0;
}
