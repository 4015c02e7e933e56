// See CSDKShim.h. Kept minimal: everything here is a thin call with errno left for the Swift caller.
#define _GNU_SOURCE
#include "CSDKShim.h"
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <sys/random.h>

#include <errno.h>
#include <malloc.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

_Thread_local void *sdk_simulated_kernel;

int sdk_spawn(const char *path, char *const argv[], char *const envp[], int ipc_fd, int stdout_fd,
              int stderr_fd, int profile_fd, int notice_fd, int netns_fd, pid_t *pid) {
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    int rc = posix_spawn_file_actions_init(&actions);
    if (rc != 0) return rc;
    rc = posix_spawnattr_init(&attr);
    if (rc != 0) {
        posix_spawn_file_actions_destroy(&actions);
        return rc;
    }
    // Sources are >= 4 (the Swift side guarantees it), so dup2 never aliases a target and always clears
    // close-on-exec on the copy.
    if (rc == 0) rc = posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&actions, stdout_fd, 1);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&actions, stderr_fd, 2);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&actions, ipc_fd, 3);
    if (rc == 0 && profile_fd >= 0) rc = posix_spawn_file_actions_adddup2(&actions, profile_fd, 4);
    if (rc == 0 && notice_fd >= 0) rc = posix_spawn_file_actions_adddup2(&actions, notice_fd, SDK_EXIT_NOTICE_FD);
    // Last: a source numbered 6 has been copied to its target by now (the namespace's own is >= 10).
    if (rc == 0 && netns_fd >= 0) rc = posix_spawn_file_actions_adddup2(&actions, netns_fd, SDK_EXIT_NOTICE_FD + 1);
    // Belt and braces: anything else that is not close-on-exec (a library's leak) does not reach the child.
    // (glibc reports a close action's error only for a descriptor out of range.)
    int highest = netns_fd >= 0 ? SDK_EXIT_NOTICE_FD + 1 : notice_fd >= 0 ? SDK_EXIT_NOTICE_FD : profile_fd >= 0 ? 4 : 3;
    if (rc == 0 && profile_fd < 0 && highest > 4) rc = posix_spawn_file_actions_addclose(&actions, 4);
    if (rc == 0 && notice_fd < 0 && highest > SDK_EXIT_NOTICE_FD) rc = posix_spawn_file_actions_addclose(&actions, SDK_EXIT_NOTICE_FD);
    int first_closed = highest + 1;
    if (rc == 0) rc = posix_spawn_file_actions_addclosefrom_np(&actions, first_closed);

    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    if (rc == 0) rc = posix_spawnattr_setsigmask(&attr, &none);
    if (rc == 0) rc = posix_spawnattr_setsigdefault(&attr, &all);
    // A new session (and so its own process group): terminal signals aimed at the app do not hit the child.
    if (rc == 0)
        rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSID);
    if (rc == 0) rc = posix_spawn(pid, path, &actions, &attr, argv, envp);

    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    return rc;
}

struct network_namespace_result { int fd; int error; };

static void *make_network_namespace(void *argument) {
    struct network_namespace_result *result = argument;
    if (unshare(CLONE_NEWNET) != 0) {
        result->error = errno;
        return NULL;
    }
    int fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        result->error = errno;
        return NULL;
    }
    result->fd = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    result->error = result->fd < 0 ? errno : 0;
    close(fd);
    return NULL;
}

int sdk_make_network_namespace(void) {
    struct network_namespace_result result = {.fd = -1, .error = 0};
    pthread_t thread;
    int rc = pthread_create(&thread, NULL, make_network_namespace, &result);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    pthread_join(thread, NULL);
    if (result.fd < 0) errno = result.error;
    return result.fd;
}

int sdk_pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

int sdk_pidfd_send_signal(int pidfd, int sig) { return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0); }

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

int sdk_waitid_pidfd(int pidfd, int *status) {
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (waitid((idtype_t)P_PIDFD, (id_t)pidfd, &info, WEXITED | WNOHANG) == -1) return -1;
    if (info.si_pid == 0) return 0;
    if (info.si_code == CLD_EXITED) {
        *status = (info.si_status & 0xFF) << 8;
    } else {
        *status = info.si_status & 0x7F;
    }
    return 1;
}

int sdk_set_parent_death_signal(int sig) { return prctl(PR_SET_PDEATHSIG, (unsigned long)sig, 0, 0, 0); }

int sdk_epoll_ctl(int epfd, int op, int fd, uint32_t events) {
    struct epoll_event ev;
    ev.events = events;
    ev.data.u64 = 0;
    ev.data.fd = fd;
    return epoll_ctl(epfd, op, fd, &ev);
}

int sdk_epoll_wait(int epfd, int32_t *fds, uint32_t *events, int max_events, int timeout_ms) {
    struct epoll_event buf[64];
    if (max_events > 64) max_events = 64;
    int n = epoll_wait(epfd, buf, max_events, timeout_ms);
    for (int i = 0; i < n; i++) {
        fds[i] = buf[i].data.fd;
        events[i] = buf[i].events;
    }
    return n;
}

int sdk_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }
int sdk_eventfd(void) { return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }
int sdk_blocking_eventfd(void) { return eventfd(0, EFD_CLOEXEC); }
int sdk_timerfd(void) { return timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK); }
int sdk_timerfd_arm(int fd, uint64_t deadline_ns) {
    if (deadline_ns == 0) deadline_ns = 1;  // an it_value of zero would disarm it
    struct itimerspec spec = {0};
    spec.it_value.tv_sec = (time_t)(deadline_ns / 1000000000u);
    spec.it_value.tv_nsec = (long)(deadline_ns % 1000000000u);
    return timerfd_settime(fd, TFD_TIMER_ABSTIME, &spec, NULL);
}

int sdk_pipe_cloexec(int fds[2]) { return pipe2(fds, O_CLOEXEC); }

int sdk_available_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    return CPU_COUNT(&set);
}

const uint32_t SDK_EPOLLIN = EPOLLIN, SDK_EPOLLOUT = EPOLLOUT, SDK_EPOLLRDHUP = EPOLLRDHUP;
const int SDK_EPOLL_CTL_ADD = EPOLL_CTL_ADD, SDK_EPOLL_CTL_MOD = EPOLL_CTL_MOD, SDK_EPOLL_CTL_DEL = EPOLL_CTL_DEL;

int sdk_set_thread_name(const char *name) { return pthread_setname_np(pthread_self(), name); }

static int fill_address(struct sockaddr_un *addr, const char *path) {
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(addr->sun_path)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(addr->sun_path, path);
    return 0;
}

int sdk_unix_listen(const char *path, int backlog) {
    struct sockaddr_un addr;
    if (fill_address(&addr, path) != 0) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 || listen(fd, backlog) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

int sdk_unix_connect(const char *path) {
    struct sockaddr_un addr;
    if (fill_address(&addr, path) != 0) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int rc;
    do { rc = connect(fd, (struct sockaddr *)&addr, sizeof(addr)); } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

int sdk_accept(int listen_fd) { return accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK); }

int sdk_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid) {
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
    *pid = cred.pid;
    *uid = cred.uid;
    *gid = cred.gid;
    return 0;
}

int sdk_termination_signalfd(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) return -1;
    return signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

int sdk_read_signalfd(int fd) {
    struct signalfd_siginfo info;
    ssize_t n = read(fd, &info, sizeof(info));
    if (n == (ssize_t)sizeof(info)) return (int)info.ssi_signo;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return -1;
}

void sdk_line_buffer_stdout(void) { setvbuf(stdout, NULL, _IOLBF, 0); }

int sdk_is_listening_unix_stream(int fd) {
    int value = 0;
    socklen_t len = sizeof(value);
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &value, &len) != 0 || value != AF_UNIX) return 0;
    len = sizeof(value);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &value, &len) != 0 || value != SOCK_STREAM) return 0;
    len = sizeof(value);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &value, &len) != 0 || value == 0) return 0;
    return 1;
}

int sdk_socket_path(int fd, char *buffer, size_t size) {
    struct sockaddr_un address;
    socklen_t len = sizeof(address);
    memset(&address, 0, sizeof(address));
    if (getsockname(fd, (struct sockaddr *)&address, &len) != 0) return -1;
    if (len <= offsetof(struct sockaddr_un, sun_path) || address.sun_path[0] == 0 || size == 0) {
        errno = EINVAL;
        return -1;
    }
    size_t n = strnlen(address.sun_path, len - offsetof(struct sockaddr_un, sun_path));
    if (n >= size) n = size - 1;
    memcpy(buffer, address.sun_path, n);
    buffer[n] = 0;
    return 0;
}

int sdk_notify_datagram(const char *path, const char *message, size_t length) {
    struct sockaddr_un address;
    memset(&address, 0, sizeof(address));
    address.sun_family = AF_UNIX;
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(address.sun_path)) {
        errno = EINVAL;
        return -1;
    }
    memcpy(address.sun_path, path, n);
    if (path[0] == '@') address.sun_path[0] = 0;  // an abstract socket
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    ssize_t sent = sendto(fd, message, length, MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&address,
                          (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n));
    int saved = errno;
    close(fd);
    errno = saved;
    return sent == (ssize_t)length ? 0 : -1;
}

ssize_t sdk_send_with_fds(int sock, const void *buf, size_t len, const int *fds, int nfds, int flags) {
    if (nfds < 0 || nfds > SDK_MAX_MESSAGE_FDS) {
        errno = EINVAL;
        return -1;
    }
    union {
        char bytes[CMSG_SPACE(sizeof(int) * SDK_MAX_MESSAGE_FDS)];
        struct cmsghdr align;
    } control;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        memset(&control, 0, sizeof(control));
        msg.msg_control = control.bytes;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t n;
    do n = sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
    while (n < 0 && errno == EINTR);
    return n;
}

ssize_t sdk_recv_with_fds(int sock, void *buf, size_t len, int *fds, int max_fds, int *nfds, int *truncated) {
    union {
        char bytes[CMSG_SPACE(sizeof(int) * SDK_MAX_MESSAGE_FDS)];
        struct cmsghdr align;
    } control;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.bytes,
                         .msg_controllen = sizeof(control.bytes)};
    *nfds = 0;
    *truncated = 0;
    ssize_t n;
    do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0) return n;
    if (msg.msg_flags & MSG_CTRUNC) *truncated = 1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
            *truncated = 1;
            continue;
        }
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int *received = (int *)CMSG_DATA(c);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, received + i, sizeof(int));
            if (*nfds < max_fds) {
                fds[(*nfds)++] = fd;
            } else {
                close(fd);  // more than the caller can hold: never leaked, and reported as truncated
                *truncated = 1;
            }
        }
    }
    return n;
}

// Sealed against execution from birth (MFD_NOEXEC_SEAL, Linux 6.3): the worker's seccomp filter refuses a memfd
// without it. Older kernels do not know the flag (EINVAL) and get a plain sealable memfd.
int sdk_memfd(const char *name) {
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | 0x0008U /* MFD_NOEXEC_SEAL */);
    if (fd < 0 && errno == EINVAL) fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    return fd;
}

int sdk_random_bytes(void *buffer, size_t length) {
    if (length > 256) { errno = EINVAL; return -1; }
    ssize_t got;
    do { got = getrandom(buffer, length, 0); } while (got == -1 && errno == EINTR);
    return got == (ssize_t)length ? 0 : -1;
}

/* Random bytes for request ids, 16 at a time, from a per-thread pool that one getrandom call fills with 256:
   a getrandom per id was one of the three system calls a daemon client made per request. The pool lives in
   thread-local storage, so threads never share or lock it. A forked child empties the pool of the thread that
   forked (the only thread it has), so parent and child never hand out the same bytes. */
static __thread unsigned char random_pool[256];
static __thread size_t random_pool_left;
static pthread_once_t random_pool_once = PTHREAD_ONCE_INIT;

static void random_pool_forget(void) {
    memset(random_pool, 0, sizeof random_pool);
    random_pool_left = 0;
}

static void random_pool_register(void) { pthread_atfork(NULL, NULL, random_pool_forget); }

int sdk_random_16(void *out) {
    if (random_pool_left < 16) {
        pthread_once(&random_pool_once, random_pool_register);
        if (sdk_random_bytes(random_pool, sizeof random_pool) != 0) return -1;
        random_pool_left = sizeof random_pool;
    }
    unsigned char *from = random_pool + sizeof random_pool - random_pool_left;
    memcpy(out, from, 16);
    memset(from, 0, 16);  /* handed out once: no copy stays behind */
    random_pool_left -= 16;
    return 0;
}

/* This process's pid, read once and again in a forked child (glibc no longer caches it: a getpid per spawn, twice,
   was a system call each). The child's handler runs before fork returns there, so no thread sees the parent's. */
static pid_t cached_pid;
static pthread_once_t cached_pid_once = PTHREAD_ONCE_INIT;

static void cached_pid_forget(void) { __atomic_store_n(&cached_pid, 0, __ATOMIC_RELAXED); }

static void cached_pid_register(void) { pthread_atfork(NULL, NULL, cached_pid_forget); }

pid_t sdk_process_id(void) {
    pid_t pid = __atomic_load_n(&cached_pid, __ATOMIC_RELAXED);
    if (pid != 0) return pid;
    pthread_once(&cached_pid_once, cached_pid_register);
    pid = getpid();
    __atomic_store_n(&cached_pid, pid, __ATOMIC_RELAXED);
    return pid;
}

int sdk_seal_readonly(int fd) {
    return fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
}

int sdk_get_seals(int fd) { return fcntl(fd, F_GET_SEALS); }

int sdk_is_write_sealed(int fd) {
    int seals = fcntl(fd, F_GET_SEALS);
    return seals >= 0 && (seals & F_SEAL_WRITE) != 0;
}

int sdk_unread_output_bytes(int fd) {
    int bytes = 0;
    return ioctl(fd, SIOCOUTQ, &bytes) == 0 ? bytes : -1;
}

int sdk_flags_path_only(int flags) { return (flags & O_PATH) != 0; }

int sdk_open_path_only(const char *path) { return open(path, O_PATH | O_CLOEXEC); }

int sdk_signal_is_ignored(int signal) {
    struct sigaction current;
    return sigaction(signal, NULL, &current) == 0 && !(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN;
}

int sdk_open_regular_file(const char *path, int nofollow, int reopen_by_path, struct stat *info) {
    int checked = open(path, O_PATH | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));
    if (checked < 0) return -1;
    int result = -1, error = 0, fd = -1;
    if (fstat(checked, info) != 0) {
        error = errno;
    } else if (!S_ISREG(info->st_mode)) {
        result = SDK_OPEN_NOT_REGULAR;
    } else {
        char link[32];
        snprintf(link, sizeof link, "/proc/self/fd/%d", checked);
        fd = open(link, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        // No /proc (a chroot, some containers): the path again, without waiting on what it may name now.
        if (fd < 0 && errno == ENOENT && reopen_by_path) {
            fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0));
        }
        struct stat opened;
        if (fd < 0) {
            error = errno;
        } else if (fstat(fd, &opened) != 0) {
            error = errno;
        } else if (opened.st_dev != info->st_dev || opened.st_ino != info->st_ino) {
            result = SDK_OPEN_CHANGED;
        } else {
            int flags = fcntl(fd, F_GETFL);
            if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) error = errno; else result = fd;
        }
        if (result != fd && fd >= 0) close(fd);
    }
    close(checked);
    if (result == -1) errno = error;
    return result;
}

int sdk_is_memfd(int fd) {
    char link[32], target[16];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target);
    return n >= 7 && memcmp(target, "/memfd:", 7) == 0;
}

int sdk_is_snapshot_memfd(int fd) {
    int seals = fcntl(fd, F_GET_SEALS);
    int needed = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK;
    return seals >= 0 && (seals & needed) == needed;
}

int sdk_copy_file(int in, int out, uint64_t length) {
    loff_t offset = 0;
    int use_copy_range = 1, use_sendfile = 1;
    while ((uint64_t)offset < length) {
        size_t chunk = (size_t)((length - (uint64_t)offset) > (1u << 30) ? (1u << 30) : (length - (uint64_t)offset));
        ssize_t n = -1;
        if (use_copy_range) {
            n = copy_file_range(in, &offset, out, NULL, chunk, 0);
            if (n < 0 && errno != EINTR) {
                use_copy_range = 0;
                continue;
            }
        } else if (use_sendfile) {
            off_t o = (off_t)offset;
            n = sendfile(out, in, &o, chunk);
            if (n > 0) offset = (loff_t)o;
            if (n < 0 && errno != EINTR) {
                use_sendfile = 0;
                continue;
            }
        } else {
            char buffer[65536];
            n = pread(in, buffer, chunk < sizeof(buffer) ? chunk : sizeof(buffer), (off_t)offset);
            if (n > 0) {
                ssize_t written = 0;
                while (written < n) {
                    ssize_t w = write(out, buffer + written, (size_t)(n - written));
                    if (w < 0) {
                        if (errno == EINTR) continue;
                        return errno;
                    }
                    written += w;
                }
                offset += n;
            } else if (n < 0 && errno != EINTR) {
                return errno;
            }
        }
        if (n == 0) return EIO;  // the file is shorter than it said
    }
    return 0;
}

// MARK: Exit notices (robust futexes in a shared page)

#include <linux/futex.h>

int sdk_exit_notice_create(void **page) {
    int fd = memfd_create("sdk-host-exit-notice", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    void *mapped = MAP_FAILED;
    if (ftruncate(fd, SDK_EXIT_NOTICE_BYTES) == 0
        && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        mapped = mmap(NULL, SDK_EXIT_NOTICE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    *page = mapped;
    return fd;
}

int sdk_exit_notice_register(int fd) {
    void *page = mmap(NULL, SDK_EXIT_NOTICE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = page == MAP_FAILED ? errno : 0;
    close(fd);
    if (e) return e;
    // glibc registers a list for every thread it starts; a static program without one gets ours.
    static struct robust_list_head own;
    struct robust_list_head *head = NULL;
    size_t length = 0;
    if (syscall(SYS_get_robust_list, 0, &head, &length) != 0 || head == NULL) {
        own.list.next = &own.list;
        own.futex_offset = -(long)sizeof(uint64_t);
        own.list_op_pending = NULL;
        if (syscall(SYS_set_robust_list, &own, sizeof own) != 0) e = errno;
        head = &own;
    }
    // The kernel finds each entry's word at entry + futex_offset; the list's offset is glibc's (the mutex's lock
    // word before its list link), so the entry goes that far after the word, in the same page.
    long entry_at = -head->futex_offset;
    if (e == 0 && (entry_at < (long)sizeof(uint32_t) || entry_at > SDK_EXIT_NOTICE_BYTES - (long)sizeof(void *)
                   || entry_at % (long)sizeof(void *) != 0))
        e = EINVAL;
    if (e) {
        munmap(page, SDK_EXIT_NOTICE_BYTES);
        return e;
    }
    uint32_t *word = page;
    struct robust_list *entry = (struct robust_list *)((char *)page + entry_at);
    __atomic_store_n(word, (uint32_t)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
    entry->next = head->list.next;
    __atomic_store_n(&head->list.next, entry, __ATOMIC_RELEASE);
    return 0;  // the page stays mapped for the life of the process
}

struct sdk_futex_waitv { uint64_t val; uint64_t uaddr; uint32_t flags; uint32_t reserved; };
#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
#define SDK_FUTEX2_SIZE_U32 0x02
#define SDK_FUTEX2_PRIVATE 128
#define SDK_FUTEX_WAITV_MAX 128

int sdk_futex_waitv(uint32_t *control, uint32_t control_value, uint32_t *const *words, const uint32_t *expected,
                    int count) {
    struct sdk_futex_waitv waiters[SDK_FUTEX_WAITV_MAX];
    if (count < 0 || count >= SDK_FUTEX_WAITV_MAX) {
        errno = EINVAL;
        return -1;
    }
    waiters[0] = (struct sdk_futex_waitv){control_value, (uint64_t)(uintptr_t)control,
                                          SDK_FUTEX2_SIZE_U32 | SDK_FUTEX2_PRIVATE, 0};
    for (int i = 0; i < count; i++)
        waiters[i + 1] = (struct sdk_futex_waitv){expected[i], (uint64_t)(uintptr_t)words[i], SDK_FUTEX2_SIZE_U32, 0};
    return (int)syscall(SYS_futex_waitv, waiters, (unsigned)count + 1, 0, NULL, 0);
}

int sdk_futex_wait_private(uint32_t *word, uint32_t value, int timeout_ms) {
    struct timespec timeout = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000};
    return (int)syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, value, &timeout, NULL, 0);
}

void sdk_futex_wake_shared(uint32_t *word) { syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0); }

void sdk_futex_wake_private(uint32_t *word) { syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0); }

// The three-state futex lock of Drepper's "Futexes Are Tricky" (mutex2), with a bounded spin before the first
// sleep: 400 pauses, some microseconds on this machine's CPUs (a pause is tens of cycles on recent x86, a few
// on older ones and on arm64), less than a futex sleep and wake-up cost here.
#define SPIN_LIMIT 400

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

int sdk_spin_trylock(uint32_t *word) {
    uint32_t expected = 0;
    return __atomic_compare_exchange_n(word, &expected, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

void sdk_spin_lock(uint32_t *word) {
    if (sdk_spin_trylock(word)) return;
    for (int i = 0; i < SPIN_LIMIT; i++) {
        cpu_relax();
        if (__atomic_load_n(word, __ATOMIC_RELAXED) == 0 && sdk_spin_trylock(word)) return;
    }
    // Mark it contended (2) and sleep until it is free; whoever takes it from here leaves it marked, so the
    // unlock that follows wakes the next sleeper.
    while (__atomic_exchange_n(word, 2, __ATOMIC_ACQUIRE) != 0)
        syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

void sdk_spin_unlock(uint32_t *word) {
    if (__atomic_exchange_n(word, 0, __ATOMIC_RELEASE) == 2) syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

int sdk_open_proc_stat(pid_t pid) {
    char path[48];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    return open(path, O_RDONLY | O_CLOEXEC);
}

int sdk_exiting_status(pid_t pid, int *status) {
    int fd = sdk_open_proc_stat(pid);
    if (fd < 0) return -1;
    int result = sdk_exiting_status_fd(fd, status);
    int e = errno;
    close(fd);
    errno = e;
    return result;
}

int sdk_exiting_status_fd(int fd, int *status) {
    char text[1024];
    ssize_t n;
    do { n = pread(fd, text, sizeof text - 1, 0); } while (n < 0 && errno == EINTR);
    if (n <= 0) {
        if (n == 0) errno = EIO;
        return -1;
    }
    text[n] = 0;
    // The command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'.
    char *p = strrchr(text, ')');
    if (!p) { errno = EIO; return -1; }
    unsigned long long flags = 0;
    long long code = -1;
    int field = 2;
    for (char *save = NULL, *token = strtok_r(p + 1, " \n", &save); token; token = strtok_r(NULL, " \n", &save)) {
        field++;
        if (field == 9) flags = strtoull(token, NULL, 10);
        if (field == 52) { code = strtoll(token, NULL, 10); break; }
    }
    if (code < 0) { errno = EIO; return -1; }
    if (!(flags & 0x4)) return 0;  // PF_EXITING
    *status = (int)code;
    return 1;
}

size_t sdk_heap_bytes_in_use(void) {
    struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
}

int sdk_fix_mmap_threshold(size_t bytes) {
    return mallopt(M_MMAP_THRESHOLD, (int)bytes);
}
