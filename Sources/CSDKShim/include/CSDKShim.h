// CSDKShim: the few Linux calls Swift cannot make directly or safely: variadic syscalls (prctl, syscall),
// the packed epoll_event, and posix_spawn with its file actions and attributes (no Swift runs in the child).
#ifndef CSDKSHIM_H
#define CSDKSHIM_H

#include <stdint.h>
#include <sys/types.h>
#include <sys/stat.h>

/// Spawns `path` with exactly these descriptors in the child: /dev/null on 0, `stdout_fd` on 1, `stderr_fd`
/// on 2, `ipc_fd` on 3, `profile_fd` on 4 and `notice_fd` on 5 unless they are -1. Every other descriptor is
/// close-on-exec in the parent. The child gets an empty signal mask, default dispositions for every signal, and
/// its own session (terminal signals aimed at the app do not hit its workers). Returns 0 and sets *pid, or an
/// errno value.
int sdk_spawn(const char *path, char *const argv[], char *const envp[], int ipc_fd, int stdout_fd,
              int stderr_fd, int profile_fd, int notice_fd, int netns_fd, pid_t *pid);

/// The number of the descriptor a worker's exit-notice page is passed on (SDKHOST_EXIT_NOTICE_FD).
#define SDK_EXIT_NOTICE_FD 5
/// The size of an exit-notice page.
#define SDK_EXIT_NOTICE_BYTES 4096

/// Host side: a memfd of one page, sealed so that nobody can shrink or grow it (no SIGBUS for the host) or seal
/// it further, mapped shared into *page. Returns the memfd (close-on-exec), or -1 with errno and nothing left.
int sdk_exit_notice_create(void **page);

/// Worker side: maps the page on `fd` (and closes `fd`), stores this thread's id in its first word and links an
/// entry for that word into this thread's robust-futex list (glibc's, or a new one), so that the kernel marks
/// the word FUTEX_OWNER_DIED and wakes its waiter as this thread exits, before its memory is torn down. Call
/// from the main thread. Returns 0, or an errno value (nothing is registered).
int sdk_exit_notice_register(int fd);

/// Waits until the private futex `control` no longer holds `control_value`, or one of `count` shared futexes
/// `words[i]` no longer holds `expected[i]`, or a wake-up (futex_waitv(2)). Returns the index woken (0: control,
/// i + 1: words[i]), or -1 with errno (EAGAIN: a value had already changed).
int sdk_futex_waitv(uint32_t *control, uint32_t control_value, uint32_t *const *words, const uint32_t *expected,
                    int count);

/// Waits while the private futex `word` holds `value`, at most `timeout_ms`. 0 when woken or the value differs,
/// -1 with errno (ETIMEDOUT, EINTR).
int sdk_futex_wait_private(uint32_t *word, uint32_t value, int timeout_ms);

/// Sequentially consistent load and compare-and-swap of a 32-bit word another process may write.
static inline uint32_t sdk_atomic_load_u32(uint32_t *word) { return __atomic_load_n(word, __ATOMIC_SEQ_CST); }
static inline int sdk_atomic_cas_u32(uint32_t *word, uint32_t expected, uint32_t desired) {
    return __atomic_compare_exchange_n(word, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline uint32_t sdk_atomic_add_u32(uint32_t *word, uint32_t value) {
    return __atomic_add_fetch(word, value, __ATOMIC_SEQ_CST);
}

/// The calling thread's simulated kernel (SDKPosix's `SimulatedKernel.current`), retained by the Swift side; NULL on
/// a thread where no simulation runs. A C thread-local, not a pthread key: every wrapper asks for it on each
/// simulated descriptor, and a TLS load costs a fraction of pthread_getspecific and its key's lazy creation.
extern _Thread_local void *sdk_simulated_kernel;
static inline void *sdk_simulated_kernel_get(void) { return sdk_simulated_kernel; }
static inline void sdk_simulated_kernel_set(void *kernel) { sdk_simulated_kernel = kernel; }

/// FUTEX_WAKE of every waiter on a shared futex (the Crasher's forged exit notices).
void sdk_futex_wake_shared(uint32_t *word);

/// FUTEX_WAKE of every waiter on a private futex.
void sdk_futex_wake_private(uint32_t *word);

/// A lock word (0 free, 1 held, 2 held with sleepers) for critical sections of a few hundred nanoseconds
/// shared with the host's loop thread. Taking it spins first (the holder is running on the other core and
/// about to let go) and sleeps on the futex only if the holder does not let go within the spin; a free lock
/// goes to whoever takes it first (no hand-over to a sleeping waiter, unlike a priority-inheritance lock).
void sdk_spin_lock(uint32_t *word);
/// Whether the lock was free and is now held.
int sdk_spin_trylock(uint32_t *word);
void sdk_spin_unlock(uint32_t *word);

/// Whether process `pid` is exiting, from /proc/<pid>/stat: 1 with *status set to the wait status it is exiting
/// with (its main thread has PF_EXITING), 0 if it is not exiting, -1 with errno if that cannot be read.
int sdk_exiting_status(pid_t pid, int *status);

/// The same from a descriptor of /proc/<pid>/stat (read again from its start at each call).
int sdk_exiting_status_fd(int fd, int *status);

/// Opens /proc/<pid>/stat (close-on-exec); -1 with errno.
int sdk_open_proc_stat(pid_t pid);

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
/// timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK).
int sdk_timerfd(void);
/// Arms `fd` to expire once at `deadline_ns` on CLOCK_MONOTONIC (absolute; a past deadline expires at once).
int sdk_timerfd_arm(int fd, uint64_t deadline_ns);
/// pipe2(fds, O_CLOEXEC).
int sdk_pipe_cloexec(int fds[2]);
/// The CPUs this process may run on (its affinity mask), or -1.
int sdk_available_cpus(void);

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


/// The most descriptors one message may carry (DESIGN "Descriptors as attachments"); the kernel's own cap is 253.
#define SDK_MAX_MESSAGE_FDS 64

/// sendmsg(2) of `len` bytes with MSG_NOSIGNAL | `flags`, and `nfds` descriptors (at most SDK_MAX_MESSAGE_FDS)
/// as one SCM_RIGHTS message attached to the first byte. Returns the bytes sent or -1 with errno.
ssize_t sdk_send_with_fds(int sock, const void *buf, size_t len, const int *fds, int nfds, int flags);
/// recvmsg(2) with MSG_CMSG_CLOEXEC into `buf`, collecting at most `max_fds` received descriptors into `fds`
/// (*nfds of them). *truncated is set when the kernel cut the control data (the sender sent more descriptors
/// than fit; the kernel closed the rest) or delivered something other than SCM_RIGHTS. Returns the bytes read
/// (0 at end of file) or -1 with errno; the descriptors in `fds` are the caller's even then.
ssize_t sdk_recv_with_fds(int sock, void *buf, size_t len, int *fds, int max_fds, int *nfds, int *truncated);
/// memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING).
int sdk_memfd(const char *name);
/// Fills `buffer` with `length` (at most 256) random bytes in one getrandom call. 0, or -1 with errno.
int sdk_random_bytes(void *buffer, size_t length);
/// Fills `out` with 16 random bytes from a per-thread pool that one getrandom call refills every 16 calls (emptied
/// in a forked child). 0, or -1 with errno.
int sdk_random_16(void *out);
/// This process's pid: read once, and again after a fork (in the child).
pid_t sdk_process_id(void);
/// Seals a memfd against writing, growing and shrinking, and against further seal changes. 0 or -1 with errno.
int sdk_seal_readonly(int fd);
/// The seals of `fd` (F_GET_SEALS), or -1 with errno (EINVAL: not a memfd).
int sdk_get_seals(int fd);
/// 1 when `fd`'s seals forbid writing to it.
int sdk_is_write_sealed(int fd);
/// Bytes written to the stream socket `fd` that its peer has not read yet (SIOCOUTQ), or -1 with errno.
int sdk_unread_output_bytes(int fd);
/// A new, empty network namespace, as a descriptor (>= 10, close-on-exec), or -1 with errno: made by a
/// short-lived thread (a network namespace belongs to a thread, so the process's own stays as it was). Needs
/// CAP_SYS_ADMIN.
int sdk_make_network_namespace(void);
/// 1 when F_GETFL `flags` include O_PATH (the descriptor names a file but cannot read it), else 0.
int sdk_flags_path_only(int flags);
/// open(path, O_PATH | O_CLOEXEC): to check a file before it is opened for reading (readRegularFile), and for
/// tests and Crasher, which hand such a descriptor to the host on purpose.
int sdk_open_path_only(const char *path);
/// Opens the regular file at `path` read-only (O_CLOEXEC | O_NOCTTY, blocking) without opening anything else on
/// the way: what the path names is checked through an O_PATH descriptor, which opens nothing (a FIFO's open waits
/// for a writer, a device's runs its driver), and then that same file is opened through /proc/self/fd. Without
/// /proc, with `reopen_by_path` the path is opened again, non-blocking (a device swapped in meanwhile has its
/// open run), and kept only if it is the same file; without it, that fails (ENOENT). `nofollow`: a link at `path`
/// is not followed (and is refused, as not a regular file). FileAttachment(contentsOf:) and readRegularFile use it.
/// Returns the descriptor, with `*info` its stat; -1 with errno when a call fails; SDK_OPEN_NOT_REGULAR with
/// `*info` the stat of what the path names when that is not a regular file; SDK_OPEN_CHANGED when what was opened
/// is not what was checked (the path changed in between).
int sdk_open_regular_file(const char *path, int nofollow, int reopen_by_path, struct stat *info);
/// 1 when `signal`'s disposition is SIG_IGN (a command started in the background, or under nohup), else 0.
int sdk_signal_is_ignored(int signal);
#define SDK_OPEN_NOT_REGULAR (-2)
#define SDK_OPEN_CHANGED (-3)
/// 1 when `fd` is a memfd (its /proc/self/fd link reads "/memfd:…"), else 0.
int sdk_is_memfd(int fd);
/// 1 when `fd` is sealed against writing, growing and shrinking (only a memfd can be: seals exist on tmpfs and
/// hugetlbfs files alone, and one not made by memfd_create starts sealed against new seals), else 0.
int sdk_is_snapshot_memfd(int fd);
/// Copies `length` bytes of `in` from offset 0 to `out`'s current position: copy_file_range, else sendfile,
/// else read and write. `in`'s own offset is not moved. 0, or an errno value.
int sdk_copy_file(int in, int out, uint64_t length);
/// Bytes malloc has handed out and not had back, in every arena and in mmapped chunks (mallinfo2): for the tests
/// that hold a decoded value against what decoding it was charged.
size_t sdk_heap_bytes_in_use(void);
/// Has malloc take blocks of `bytes` or more from the kernel each (mmap) and give them back when freed, at a
/// threshold that stays put (mallopt M_MMAP_THRESHOLD: glibc otherwise raises it to the largest block freed, and
/// large buffers then come from an arena whose freed space it keeps). 1 on success.
int sdk_fix_mmap_threshold(size_t bytes);

#endif
