// CSDKShim: the few Linux calls Swift cannot make directly or safely: variadic syscalls (prctl, syscall),
// the packed epoll_event, and posix_spawn with its file actions and attributes (no Swift runs in the child).
#ifndef CSDKSHIM_H
#define CSDKSHIM_H

#include <stdint.h>
#include <sys/types.h>

/// Spawns `path` with exactly these descriptors in the child: /dev/null on 0, `stdout_fd` on 1, `stderr_fd`
/// on 2, `ipc_fd` on 3, and `profile_fd` on 4 unless it is -1. Every other descriptor is close-on-exec in the
/// parent. The child gets an empty signal mask, default dispositions for every signal, and its own session
/// (terminal signals aimed at the app do not hit its workers). Returns 0 and sets *pid, or an errno value.
int sdk_spawn(const char *path, char *const argv[], char *const envp[], int ipc_fd, int stdout_fd,
              int stderr_fd, int profile_fd, pid_t *pid);

/// pidfd_open(2); returns the descriptor (close-on-exec by kernel contract) or -1 with errno.
int sdk_pidfd_open(pid_t pid);
/// pidfd_send_signal(2); returns 0 or -1 with errno.
int sdk_pidfd_send_signal(int pidfd, int sig);

/// waitid(P_PIDFD, pidfd, WEXITED | WNOHANG): reaps the child the pidfd names, never a recycled pid. Returns 1
/// and sets *status to a wait status (as waitpid gives) if it was reaped, 0 if it has not exited, -1 with errno.
int sdk_waitid_pidfd(int pidfd, int *status);

/// prctl(PR_SET_PDEATHSIG, sig); returns 0 or -1 with errno.
int sdk_set_parent_death_signal(int sig);

/// epoll_create1(EPOLL_CLOEXEC).
int sdk_epoll_create(void);
/// eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK).
int sdk_eventfd(void);
/// eventfd(0, EFD_CLOEXEC): blocking reads, for a thread that sleeps until woken.
int sdk_blocking_eventfd(void);
/// pipe2(fds, O_CLOEXEC).
int sdk_pipe_cloexec(int fds[2]);

/// setvbuf(stdout, NULL, _IOLBF, 0): line-buffered stdout (Swift cannot touch the `stdout` global safely).
void sdk_line_buffer_stdout(void);

/// pthread_setname_np(pthread_self(), name): names the calling thread (15 characters at most).
int sdk_set_thread_name(const char *name);

/// epoll event bits and control operations, which Swift's Glibc module does not export.
extern const uint32_t SDK_EPOLLIN, SDK_EPOLLOUT, SDK_EPOLLRDHUP;
extern const int SDK_EPOLL_CTL_ADD, SDK_EPOLL_CTL_MOD, SDK_EPOLL_CTL_DEL;

/// epoll_ctl with the fd stored as the event's data. op: EPOLL_CTL_ADD/MOD/DEL.
int sdk_epoll_ctl(int epfd, int op, int fd, uint32_t events);
/// epoll_wait that unpacks events into parallel arrays; returns the count or -1 with errno.
int sdk_epoll_wait(int epfd, int32_t *fds, uint32_t *events, int max_events, int timeout_ms);

/// A listening Unix stream socket bound to `path` (close-on-exec, non-blocking). Returns the fd or -1 with
/// errno (ENAMETOOLONG when the path does not fit sun_path).
int sdk_unix_listen(const char *path, int backlog);
/// A Unix stream socket connected to `path` (close-on-exec, non-blocking). Returns the fd or -1 with errno.
int sdk_unix_connect(const char *path);
/// accept4 with SOCK_CLOEXEC | SOCK_NONBLOCK.
int sdk_accept(int listen_fd);
/// SO_PEERCRED of a connected Unix socket. Returns 0 or -1 with errno.
int sdk_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid);
/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (threads it creates inherit the mask) and returns a
/// signalfd (close-on-exec, non-blocking) that reads them; -1 with errno on failure.
int sdk_termination_signalfd(void);
/// Reads one pending signal from a signalfd; returns the signal number, 0 if none, -1 with errno.
int sdk_read_signalfd(int fd);
/// 1 if `fd` is a listening Unix stream socket (what systemd passes for our .socket unit), else 0.
int sdk_is_listening_unix_stream(int fd);
/// The filesystem path a Unix socket is bound to, NUL-terminated in `buffer`. 0, or -1 with errno.
int sdk_socket_path(int fd, char *buffer, size_t size);
/// Sends one datagram to the Unix socket `path` ("@name" for an abstract one): the sd_notify protocol.
/// Non-blocking. 0, or -1 with errno.
int sdk_notify_datagram(const char *path, const char *message, size_t length);

#endif
