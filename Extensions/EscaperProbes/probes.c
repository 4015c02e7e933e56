#define _GNU_SOURCE
#include "EscaperProbes.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/xattr.h>

long probe_unshare(int flags) { return syscall(SYS_unshare, flags); }

long probe_ptrace_seize(pid_t pid) {
    long rc = syscall(SYS_ptrace, PTRACE_SEIZE, pid, 0, 0);
    if (rc == 0) syscall(SYS_ptrace, PTRACE_DETACH, pid, 0, 0);
    return rc;
}

long probe_io_uring_setup(void) {
    uint8_t params[120];
    memset(params, 0, sizeof params);
    return syscall(SYS_io_uring_setup, 1, params);
}

long probe_userfaultfd(void) { return syscall(SYS_userfaultfd, 0); }

long probe_bpf_map(void) {
    uint32_t attr[32];
    memset(attr, 0, sizeof attr);
    attr[0] = 2;  // BPF_MAP_TYPE_ARRAY
    attr[1] = 4;  // key size
    attr[2] = 4;  // value size
    attr[3] = 1;  // max entries
    return syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, attr, sizeof attr);
}

long probe_perf_event(void) {
    uint8_t attr[128];
    memset(attr, 0, sizeof attr);
    uint32_t type = 1, size = sizeof attr;  // PERF_TYPE_SOFTWARE
    uint64_t config = 1;                     // PERF_COUNT_SW_TASK_CLOCK
    memcpy(attr, &type, 4);
    memcpy(attr + 4, &size, 4);
    memcpy(attr + 8, &config, 8);
    return syscall(SYS_perf_event_open, attr, 0, -1, -1, 0);
}

long probe_add_key(void) { return syscall(SYS_add_key, "user", "sdk-host-probe", "x", 1, -2 /* process keyring */); }

// Sealed against execution, as the runtime's own memfds are: the memory probes test the limits, not the flag.
long probe_memfd(void) { return syscall(SYS_memfd_create, "sdk-host-probe", 1 /* MFD_CLOEXEC */ | 8 /* MFD_NOEXEC_SEAL */); }

long probe_memfd_exec(void) {
    long fd = syscall(SYS_memfd_create, "sdk-host-probe-exec", 1 /* MFD_CLOEXEC */);
    if (fd < 0) return -1;
    char *argv[] = {"probe", NULL}, *envp[] = {NULL};
    // The memfd is empty: if the exec is let through, the kernel answers ENOEXEC and nothing runs.
    syscall(SYS_execveat, fd, "", argv, envp, AT_EMPTY_PATH);
    int error = errno;
    close((int)fd);
    if (error == ENOEXEC) return 0;
    errno = error;
    return -1;
}

long probe_prlimit(pid_t pid) {
    struct rlimit old;
    return syscall(SYS_prlimit64, pid, RLIMIT_NOFILE, NULL, &old);
}

long probe_setpriority(pid_t pid) {
    errno = 0;
    int value = getpriority(PRIO_PROCESS, (id_t)pid);
    if (value == -1 && errno != 0) return -1;
    return setpriority(PRIO_PROCESS, (id_t)pid, value);
}

long probe_affinity(pid_t pid) {
    cpu_set_t set;
    if (sched_getaffinity(pid, sizeof set, &set) != 0) return -1;
    return sched_setaffinity(pid, sizeof set, &set);
}

long probe_chmod(const char *path) {
    struct stat info;
    if (stat(path, &info) != 0) return -1;
    return chmod(path, info.st_mode & 07777);
}

long probe_utime(const char *path) {
    // Both times set to what they are (UTIME_OMIT twice would succeed without looking at the file at all).
    struct stat info;
    if (stat(path, &info) != 0) return -1;
    struct timespec times[2] = {info.st_atim, info.st_mtim};
    return utimensat(AT_FDCWD, path, times, 0);
}

long probe_xattr(const char *path) {
    if (setxattr(path, "user.sdkhost-probe", "1", 1, 0) != 0) return -1;
    removexattr(path, "user.sdkhost-probe");
    return 0;
}

long probe_inotify(const char *path) {
    int fd = inotify_init1(IN_CLOEXEC);
    if (fd < 0) return -1;
    int rc = inotify_add_watch(fd, path, IN_ACCESS);
    int error = errno;
    close(fd);
    errno = error;
    return rc < 0 ? -1 : 0;
}

long probe_dgram(const char *path, int pair) {
    int fds[2] = {-1, -1};
    int fd;
    if (pair) {
        if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, fds) != 0) return -1;
        fd = fds[0];
    } else {
        fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
    }
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strncpy(address.sun_path, path, sizeof address.sun_path - 1);
    long rc = sendto(fd, "x", 1, 0, (struct sockaddr *)&address, sizeof address);
    int error = errno;
    close(fd);
    if (fds[1] >= 0) close(fds[1]);
    errno = error;
    return rc < 0 ? -1 : 0;
}

long probe_mount(const char *folder) {
    long rc = mount("sdk-host-probe", folder, "tmpfs", 0, "size=1m");
    if (rc == 0) umount2(folder, MNT_DETACH);
    return rc;
}

long probe_clone3(void) {
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.exit_signal = SIGCHLD;
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) _exit(0);
    if (pid > 0) waitpid((pid_t)pid, NULL, 0);
    return pid;
}

long probe_x32(void) {
#if defined(__x86_64__)
    return syscall(0x40000000 | SYS_getpid);
#else
    errno = ENOSYS;
    return -1;
#endif
}

#define REPORT_CREDENTIALS "ESCAPER_REPORT_CREDENTIALS"

/// Escaper started by probe_exec_self: writes its credentials to stdout and exits before the extension runtime
/// (which would refuse to run without a host connection).
__attribute__((constructor)) static void report_credentials_if_asked(void) {
    if (!getenv(REPORT_CREDENTIALS)) return;
    char status[8192];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    long n = fd >= 0 ? read(fd, status, sizeof status - 1) : -1;
    if (n <= 0) _exit(1);
    status[n] = 0;
    for (char *line = status; *line;) {
        char *end = strchr(line, '\n');
        long length = end ? end - line + 1 : (long)strlen(line);
        if (strncmp(line, "Cap", 3) == 0 || strncmp(line, "NoNewPrivs", 10) == 0) (void)!write(1, line, length);
        line += length;
    }
    _exit(0);
}

long probe_exec_self(char *out, long size) {
    int channel[2];
    if (pipe2(channel, O_CLOEXEC) != 0) return -errno;
    char *argv[] = {"escaper-credentials", NULL};
    char *envp[] = {REPORT_CREDENTIALS "=1", NULL};
    pid_t child = fork();
    if (child < 0) {
        int error = errno;
        close(channel[0]);
        close(channel[1]);
        return -error;
    }
    if (child == 0) {
        dup2(channel[1], 1);
        execve("/proc/self/exe", argv, envp);
        _exit(100 + (errno & 0x3f));
    }
    close(channel[1]);
    long total = 0;
    while (total < size - 1) {
        long n = read(channel[0], out + total, size - 1 - total);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        total += n;
    }
    out[total] = 0;
    close(channel[0]);
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {}
    if (WIFEXITED(status) && WEXITSTATUS(status) >= 100) return -(WEXITSTATUS(status) - 100);
    return total;
}

long probe_list(const char *path, char *out, long size) {
    DIR *dir = opendir(path);
    if (!dir) return -errno;
    long used = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        const char *name = entry->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) continue;
        long n = (long)strlen(name);
        if (used + n + 1 > size) break;
        memcpy(out + used, name, (size_t)n);
        used += n;
        out[used++] = '\n';
    }
    closedir(dir);
    return used;
}
