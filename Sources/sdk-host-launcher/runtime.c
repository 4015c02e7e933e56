// The launcher's own C runtime: program entry, the system calls it makes, and the few library functions it uses,
// so that it links without glibc (Package.swift passes -nostdlib).
//
// Why: the launcher runs at every worker spawn, and a statically linked glibc program spends its first ~0.3 ms
// (on the CI-class VM) in start-up code that probes the CPU with CPUID instructions, each of which traps to the
// hypervisor there; measured with perf, from exec to the first system call. Without glibc, exec to main is
// ~0.1 ms. Everything here is a thin wrapper over one system call or a short loop; nothing is copied from a libc.
//
// The functions keep their standard names and signatures, so the launcher's other files are ordinary C compiled
// against the system headers (for types and constants only). x86_64 and aarch64.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// MARK: System calls

static long raw_syscall6(long n, long a, long b, long c, long d, long e, long f) {
#if defined(__x86_64__)
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long result;
    __asm__ volatile("syscall"
                     : "=a"(result)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return result;
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
    return x0;
#else
#error "sdk-host-launcher's runtime supports x86_64 and aarch64"
#endif
}

/// A system call that returns -errno and sets nothing: for a child that shares this memory (CLONE_VM) while
/// another process of the launcher runs in it, and so must not write the shared `errno`.
long raw_syscall(long n, long a, long b, long c, long d, long e, long f) { return raw_syscall6(n, a, b, c, d, e, f); }

static int error_number;

int *__errno_location(void) { return &error_number; }

/// The kernel returns -errno; C callers expect -1 and errno.
static long checked(long result) {
    if (result < 0 && result > -4096) {
        error_number = (int)-result;
        return -1;
    }
    return result;
}

#define SYS(n, a, b, c, d, e, f) checked(raw_syscall6((n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f)))

long syscall(long number, ...) {
    va_list args;
    va_start(args, number);
    long a = va_arg(args, long), b = va_arg(args, long), c = va_arg(args, long);
    long d = va_arg(args, long), e = va_arg(args, long), f = va_arg(args, long);
    va_end(args);
    return SYS(number, a, b, c, d, e, f);
}

void _exit(int status) {
    for (;;) raw_syscall6(SYS_exit_group, status, 0, 0, 0, 0, 0);
}

ssize_t read(int fd, void *buffer, size_t count) { return SYS(SYS_read, fd, buffer, count, 0, 0, 0); }
ssize_t write(int fd, const void *buffer, size_t count) { return SYS(SYS_write, fd, buffer, count, 0, 0, 0); }
int close(int fd) { return (int)SYS(SYS_close, fd, 0, 0, 0, 0, 0); }

int open(const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | __O_TMPFILE)) {
        va_list args;
        va_start(args, flags);
        mode = va_arg(args, mode_t);
        va_end(args);
    }
    return (int)SYS(SYS_openat, AT_FDCWD, path, flags, mode, 0, 0);
}

int fstat(int fd, struct stat *info) {
#if defined(__x86_64__)
    return (int)SYS(SYS_fstat, fd, info, 0, 0, 0, 0);
#else
    return (int)SYS(SYS_newfstatat, fd, "", info, AT_EMPTY_PATH, 0, 0);
#endif
}

int pipe2(int fds[2], int flags) { return (int)SYS(SYS_pipe2, fds, flags, 0, 0, 0, 0); }

int poll(struct pollfd *fds, nfds_t count, int timeout) {
    struct timespec limit = {.tv_sec = timeout / 1000, .tv_nsec = (long)(timeout % 1000) * 1000000};
    return (int)SYS(SYS_ppoll, fds, count, timeout < 0 ? NULL : &limit, NULL, 8, 0);
}

int execve(const char *path, char *const argv[], char *const envp[]) {
    return (int)SYS(SYS_execve, path, argv, envp, 0, 0, 0);
}

pid_t fork(void) { return (pid_t)SYS(SYS_clone, SIGCHLD, 0, 0, 0, 0, 0); }

// clone(2) onto a stack the caller gives: the child starts in `entry(arg)` on that stack and never returns from it
// (it execs or exits), so the parent's stack is never touched, which CLONE_VM needs. The syscall's argument order
// (flags, stack, parent_tid, then child_tid and tls, both 0) is the same on both architectures but for the last
// two, which are zero here.
long sdk_clone_raw(unsigned long flags, void *stack_top, int *parent_tid, void (*entry)(void *), void *arg);
#if defined(__x86_64__)
__asm__(".text\n.global sdk_clone_raw\n.type sdk_clone_raw,@function\nsdk_clone_raw:\n"
        "\tand $-16, %rsi\n\tsub $16, %rsi\n\tmov %rcx, 0(%rsi)\n\tmov %r8, 8(%rsi)\n"
        "\tmov $56, %eax\n\txor %r10d, %r10d\n\txor %r8d, %r8d\n\tsyscall\n"
        "\ttest %rax, %rax\n\tjnz 1f\n"
        "\txor %ebp, %ebp\n\tpop %rax\n\tpop %rdi\n\tcall *%rax\n\thlt\n"
        "1:\tret\n");
#elif defined(__aarch64__)
__asm__(".text\n.global sdk_clone_raw\n.type sdk_clone_raw,%function\nsdk_clone_raw:\n"
        "\tand x1, x1, #-16\n\tstp x3, x4, [x1, #-16]!\n\tmov x8, #220\n\tmov x3, #0\n\tmov x4, #0\n\tsvc #0\n"
        "\tcbnz x0, 1f\n"
        "\tldp x1, x0, [sp], #16\n\tmov x29, #0\n\tmov x30, #0\n\tblr x1\n\tbrk #0\n"
        "1:\tret\n");
#endif

pid_t clone_onto(unsigned long flags, void *stack_top, int *parent_tid, void (*entry)(void *), void *arg) {
    return (pid_t)checked(sdk_clone_raw(flags, stack_top, parent_tid, entry, arg));
}

pid_t waitpid(pid_t pid, int *status, int options) { return (pid_t)SYS(SYS_wait4, pid, status, options, 0, 0, 0); }

int kill(pid_t pid, int sig) { return (int)SYS(SYS_kill, pid, sig, 0, 0, 0, 0); }
pid_t getpid(void) { return (pid_t)SYS(SYS_getpid, 0, 0, 0, 0, 0, 0); }
pid_t getppid(void) { return (pid_t)SYS(SYS_getppid, 0, 0, 0, 0, 0, 0); }
pid_t getsid(pid_t pid) { return (pid_t)SYS(SYS_getsid, pid, 0, 0, 0, 0, 0); }
pid_t setsid(void) { return (pid_t)SYS(SYS_setsid, 0, 0, 0, 0, 0, 0); }
uid_t geteuid(void) { return (uid_t)SYS(SYS_geteuid, 0, 0, 0, 0, 0, 0); }
gid_t getegid(void) { return (gid_t)SYS(SYS_getegid, 0, 0, 0, 0, 0, 0); }
int unshare(int flags) { return (int)SYS(SYS_unshare, flags, 0, 0, 0, 0, 0); }

int prctl(int option, ...) {
    va_list args;
    va_start(args, option);
    unsigned long a = va_arg(args, unsigned long), b = va_arg(args, unsigned long);
    unsigned long c = va_arg(args, unsigned long), d = va_arg(args, unsigned long);
    va_end(args);
    return (int)SYS(SYS_prctl, option, a, b, c, d, 0);
}

int getrlimit(__rlimit_resource_t resource, struct rlimit *limit) {
    return (int)SYS(SYS_prlimit64, 0, resource, NULL, limit, 0, 0);
}

int setrlimit(__rlimit_resource_t resource, const struct rlimit *limit) {
    return (int)SYS(SYS_prlimit64, 0, resource, limit, NULL, 0, 0);
}

long sysconf(int name) { return name == _SC_OPEN_MAX ? 1024 : -1; }

// MARK: Signals (the kernel's sigset is 8 bytes: the first 8 of glibc's sigset_t)

int sigemptyset(sigset_t *set) {
    memset(set, 0, sizeof *set);
    return 0;
}

int sigaddset(sigset_t *set, int sig) {
    if (sig < 1 || sig > 64) {
        error_number = EINVAL;
        return -1;
    }
    ((unsigned long *)set)[0] |= 1UL << (sig - 1);
    return 0;
}

int sigprocmask(int how, const sigset_t *set, sigset_t *old) {
    return (int)SYS(SYS_rt_sigprocmask, how, set, old, 8, 0, 0);
}

int sigwaitinfo(const sigset_t *set, siginfo_t *info) {
    return (int)SYS(SYS_rt_sigtimedwait, set, info, NULL, 8, 0, 0);
}

struct kernel_sigaction {
    void (*handler)(int);
    unsigned long flags;
    void (*restorer)(void);
    unsigned long mask;
};

#if defined(__x86_64__)
// x86_64 returns from a handler through rt_sigreturn, called by a restorer the process provides.
void sdk_launcher_restore_rt(void);
__asm__(".text\n.align 16\nsdk_launcher_restore_rt:\n\tmov $15, %rax\n\tsyscall\n\thlt\n");
#define SDK_SA_RESTORER 0x04000000
#endif

int sigaction(int sig, const struct sigaction *action, struct sigaction *old) {
    (void)old;
    struct kernel_sigaction k = {0};
    if (action) {
        k.handler = action->sa_handler;
        k.flags = (unsigned long)action->sa_flags;
        k.mask = ((const unsigned long *)&action->sa_mask)[0];
#if defined(__x86_64__)
        k.flags |= SDK_SA_RESTORER;
        k.restorer = sdk_launcher_restore_rt;
#endif
    }
    return (int)SYS(SYS_rt_sigaction, sig, action ? &k : NULL, NULL, 8, 0, 0);
}

__sighandler_t signal(int sig, __sighandler_t handler) {
    struct sigaction action = {0};
    action.sa_handler = handler;
    return sigaction(sig, &action, NULL) == 0 ? SIG_DFL : SIG_ERR;
}

// MARK: Memory and strings

void *memset(void *to, int byte, size_t n) {
    unsigned char *p = to;
    while (n--) *p++ = (unsigned char)byte;
    return to;
}

void *memcpy(void *restrict to, const void *restrict from, size_t n) {
    unsigned char *d = to;
    const unsigned char *s = from;
    while (n--) *d++ = *s++;
    return to;
}

void *memmove(void *to, const void *from, size_t n) {
    unsigned char *d = to;
    const unsigned char *s = from;
    if (d < s) {
        while (n--) *d++ = *s++;
    } else {
        while (n--) d[n] = s[n];
    }
    return to;
}

int memcmp(const void *a, const void *b, size_t n) {
    const unsigned char *x = a, *y = b;
    for (; n; n--, x++, y++)
        if (*x != *y) return *x - *y;
    return 0;
}

size_t strlen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

int strncmp(const char *a, const char *b, size_t n) {
    for (; n > 0; a++, b++, n--) {
        if (*a != *b) return (unsigned char)*a - (unsigned char)*b;
        if (*a == 0) return 0;
    }
    return 0;
}

char *strstr(const char *haystack, const char *needle) {
    size_t n = strlen(needle);
    for (; *haystack; haystack++)
        if (strncmp(haystack, needle, n) == 0) return (char *)haystack;
    return n == 0 ? (char *)haystack : NULL;
}

int strcmp(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return (unsigned char)*a - (unsigned char)*b;
}

/// Allocation from one static arena, never freed: the launcher runs for a moment and then execs. The arena is
/// BSS, so only the pages used are ever touched. The profile is at most 1 MiB and its strings are decoded once.
static unsigned char arena[4 << 20] __attribute__((aligned(16)));
static size_t arena_used;

void *malloc(size_t size) {
    size_t rounded = (size + 15) & ~(size_t)15;
    if (rounded < size || rounded > sizeof arena - arena_used) {
        error_number = ENOMEM;
        return NULL;
    }
    void *p = arena + arena_used;
    arena_used += rounded;
    return p;
}

void *calloc(size_t count, size_t size) {
    if (size && count > (size_t)-1 / size) {
        error_number = ENOMEM;
        return NULL;
    }
    return malloc(count * size);  // the arena is zero and never reused
}

void free(void *p) { (void)p; }

// MARK: Error text

char *strerror(int error) {
    static const struct {
        int code;
        const char *text;
    } known[] = {
        {EPERM, "Operation not permitted"}, {ENOENT, "No such file or directory"}, {ESRCH, "No such process"},
        {EINTR, "Interrupted system call"}, {EIO, "Input/output error"}, {E2BIG, "Argument list too long"},
        {ENOEXEC, "Exec format error"}, {EBADF, "Bad file descriptor"}, {ECHILD, "No child processes"},
        {EAGAIN, "Resource temporarily unavailable"}, {ENOMEM, "Cannot allocate memory"},
        {EACCES, "Permission denied"}, {EFAULT, "Bad address"}, {EBUSY, "Device or resource busy"},
        {EEXIST, "File exists"}, {ENOTDIR, "Not a directory"}, {EISDIR, "Is a directory"},
        {EINVAL, "Invalid argument"}, {ENFILE, "Too many open files in system"}, {EMFILE, "Too many open files"},
        {ETXTBSY, "Text file busy"}, {EFBIG, "File too large"}, {ENOSPC, "No space left on device"},
        {EROFS, "Read-only file system"}, {EPIPE, "Broken pipe"}, {ERANGE, "Numerical result out of range"},
        {ENAMETOOLONG, "File name too long"}, {ENOSYS, "Function not implemented"},
        {ELOOP, "Too many levels of symbolic links"}, {EUSERS, "Too many users"},
        {EOPNOTSUPP, "Operation not supported"}, {ENOTSUP, "Operation not supported"},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (known[i].code == error) return (char *)known[i].text;
    static char unknown[32];
    snprintf(unknown, sizeof unknown, "Unknown error %d", error);
    return unknown;
}

// MARK: Formatting: %s (with a precision), %d, %u, %ld, %lu, %lld, %llu, %zu, %x and %%

struct sink {
    char *out;
    size_t size;
    size_t length;  // what the whole text needs, as vsnprintf returns
};

static void put(struct sink *s, char c) {
    if (s->length + 1 < s->size) s->out[s->length] = c;
    s->length++;
}

static void put_unsigned(struct sink *s, unsigned long long value, unsigned base) {
    char digits[24];
    int n = 0;
    do {
        digits[n++] = "0123456789abcdef"[value % base];
        value /= base;
    } while (value);
    while (n) put(s, digits[--n]);
}

int vsnprintf(char *out, size_t size, const char *format, va_list args) {
    struct sink s = {out, size, 0};
    for (const char *f = format; *f; f++) {
        if (*f != '%') {
            put(&s, *f);
            continue;
        }
        f++;
        long precision = -1;
        if (*f == '.') {
            precision = 0;
            for (f++; *f >= '0' && *f <= '9'; f++) precision = precision * 10 + (*f - '0');
        }
        int longs = 0;
        while (*f == 'l') longs++, f++;
        if (*f == 'z') longs = 2, f++;
        switch (*f) {
        case 's': {
            const char *text = va_arg(args, const char *);
            if (!text) text = "(null)";
            for (long i = 0; text[i] && (precision < 0 || i < precision); i++) put(&s, text[i]);
            break;
        }
        case 'd': {
            long long value = longs >= 2 ? va_arg(args, long long) : longs ? va_arg(args, long) : va_arg(args, int);
            unsigned long long magnitude = (unsigned long long)value;
            if (value < 0) {
                put(&s, '-');
                magnitude = 0ULL - magnitude;
            }
            put_unsigned(&s, magnitude, 10);
            break;
        }
        case 'u':
        case 'x': {
            unsigned long long value = longs >= 2 ? va_arg(args, unsigned long long)
                                       : longs   ? va_arg(args, unsigned long)
                                                 : va_arg(args, unsigned);
            put_unsigned(&s, value, *f == 'x' ? 16 : 10);
            break;
        }
        case '%': put(&s, '%'); break;
        case '\0': f--; break;
        default: put(&s, '%'); put(&s, *f); break;
        }
    }
    if (size) out[s.length < size ? s.length : size - 1] = '\0';
    return (int)s.length;
}

int snprintf(char *out, size_t size, const char *format, ...) {
    va_list args;
    va_start(args, format);
    int n = vsnprintf(out, size, format, args);
    va_end(args);
    return n;
}

int dprintf(int fd, const char *format, ...) {
    char text[4096];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(text, sizeof text, format, args);
    va_end(args);
    size_t length = n < (int)sizeof text ? (size_t)n : sizeof text - 1;
    for (size_t off = 0; off < length;) {
        ssize_t w = write(fd, text + off, length - off);
        if (w < 0 && error_number == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    return n;
}

// MARK: Entry

int main(int argc, char **argv);

/// Called by _start with the initial stack: argc, then argv, a NULL, the environment (unused: the launcher
/// passes the profile's environment to execve).
__attribute__((used, noreturn)) void sdk_launcher_start(long *stack);
void sdk_launcher_start(long *stack) {
    int argc = (int)stack[0];
    char **argv = (char **)(stack + 1);
    _exit(main(argc, argv));
}

#if defined(__x86_64__)
__asm__(".text\n.global _start\n_start:\n\txor %ebp, %ebp\n\tmov %rsp, %rdi\n\tand $-16, %rsp\n\tcall sdk_launcher_start\n\thlt\n");
#elif defined(__aarch64__)
__asm__(".text\n.global _start\n_start:\n\tmov x29, #0\n\tmov x30, #0\n\tmov x0, sp\n\tand x1, x0, #-16\n\tmov sp, x1\n"
        "\tbl sdk_launcher_start\n\tbrk #0\n");
#endif

// MARK: What swiftc's link line asks for
//
// SwiftPM links every executable with swiftc, which adds swiftrt.o (a constructor that registers the image's Swift
// metadata with the runtime), the Swift runtime archives, and forced references to three pthread functions (for
// its static dispatch library). The launcher is C, has one thread and no Swift metadata: defining these here
// means the linker pulls nothing from those archives (the launcher was 9.5 MB with them, and ran their static
// constructors at every spawn).
void swift_addNewDSOImage(const void *header) { (void)header; }
int _swift_backtrace_isThunkFunction(const char *name) {
    (void)name;
    return 0;
}
pthread_t pthread_self(void) { return 0; }
int pthread_once(pthread_once_t *once, void (*routine)(void)) {
    if (*once == 0) {
        *once = 1;
        routine();
    }
    return 0;
}
int pthread_key_create(pthread_key_t *key, void (*destructor)(void *)) {
    (void)key;
    (void)destructor;
    error_number = EAGAIN;
    return EAGAIN;
}
