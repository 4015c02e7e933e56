// sdk-host-launcher: spawned by the host in a worker's place. It reads the worker's sandbox profile (a binary
// property list on descriptor 4), applies it in the order bubblewrap, minijail and nsjail share, and execs the
// extension in its own process, so that no layer depends on the extension's cooperation and the host's child
// *is* the worker: its pid, exit status and signals are the extension's (shared/DESIGN.md "Sandbox").
//
//   descriptors but 0-3 (and 5, an exit-notice page) closed -> session (posix_spawn made one) ->
//   parent-death signal, parent checked -> rlimits -> user, pid, mount, IPC, UTS (and network) namespaces ->
//   grants opened -> worker's uid -> new root -> no_new_privs -> capabilities dropped -> Landlock -> seccomp ->
//   `sandboxed` frame to the host -> execve
//
// Under strict and bestEffort every worker is born inside its namespaces (a pid namespace takes only children),
// so the launcher stays as its supervisor:
//
//   launcher (the host's child)        forwards termination signals; when the worker ends, kills the namespace
//     +-- init (pid 1)                 reaps orphans; its death makes the kernel kill every process left inside
//     +-- worker (pid 2)               new session, parent-death signal, the remaining layers, execve
//
// and exits the way the worker did (its code, or its signal re-raised), so the host sees the worker's status.
// Under `Sandbox none` (or bestEffort where no namespace can be made) there is no pid 1 whose death takes the
// worker's processes with it: the launcher forks the worker as a child subreaper, so that every process the
// worker leaves behind is reparented to it, and kills them all when the worker ends.
//
// Before execve the launcher sends the host one frame, `sandboxed`, naming the layers the worker runs under and
// what bestEffort skipped. A layer that strict requires and cannot apply ends the launch: a `launchFailed` frame
// with "sandbox: <layer> unavailable: <why>", a line on stderr, exit status 125.
//
// `sdk-host-launcher --doctor` prints, one per line, each layer as available or not and why.
#define _GNU_SOURCE
#include "bplist.h"
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROFILE_FD 4
#define HOST_FD 3
#define NOTICE_FD 5
#define NETWORK_NAMESPACE_FD 6
#define LAUNCH_FAILED_STATUS 125
#define MAX_PROFILE_BYTES (1 << 20)

static struct profile profile;
static const char *layers[16];
static size_t layer_count;
static char skipped_text[8][512];
static const char *skipped[8];
static size_t skipped_count;

static void send_frame(const struct bp_entry *entries, size_t count) {
    static uint8_t frame[16384];
    size_t length = bp_write_frame(entries, count, frame, sizeof frame);
    for (size_t off = 0; off < length;) {
        ssize_t n = write(HOST_FD, frame + off, length - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        off += (size_t)n;
    }
}

/// Ends the launch: tells the host why (a frame and a stderr line) and exits with LAUNCH_FAILED_STATUS.
static void launch_failed(const char *format, ...) {
    char reason[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(reason, sizeof reason, format, args);
    va_end(args);
    struct bp_entry entries[] = {{.key = "type", .string = "launchFailed"}, {.key = "reason", .string = reason}};
    send_frame(entries, 2);
    dprintf(2, "sdk-host-launcher: %s: %s\n", profile.extension ? profile.extension : "?", reason);
    _exit(LAUNCH_FAILED_STATUS);
}

/// Adds a line to what the `sandboxed` frame reports as skipped (at most 8).
static void note(const char *format, ...) {
    if (skipped_count >= 8) return;
    va_list args;
    va_start(args, format);
    vsnprintf(skipped_text[skipped_count], sizeof skipped_text[0], format, args);
    va_end(args);
    skipped[skipped_count] = skipped_text[skipped_count];
    skipped_count++;
}

/// A layer that could not be applied: fatal under strict; under bestEffort noted and skipped.
static void unavailable(const char *layer, int error, const char *why) {
    if (profile.mode == SANDBOX_STRICT)
        launch_failed("sandbox: %s unavailable: %s (%s)", layer, why, strerror(error));
    note("%s: %s (%s)", layer, why, strerror(error));
}

static void applied(const char *layer) {
    if (layer_count < 16) layers[layer_count++] = layer;
}

// MARK: Profile

static struct paths paths_for(const struct bp_doc *doc, const char *key) {
    struct paths list = {0};
    size_t object = bp_lookup(doc, key);
    if (object == (size_t)-1) return list;
    list.items = bp_string_array(doc, object, &list.count);
    if (list.items == NULL) launch_failed("profile: %s must be an array of strings", key);
    return list;
}

static char *string_for(const struct bp_doc *doc, const char *key, int required) {
    size_t object = bp_lookup(doc, key);
    char *value = object == (size_t)-1 ? NULL : bp_string(doc, object);
    if (value == NULL && required) launch_failed("profile: %s is missing or not a string", key);
    return value;
}

static long long integer_for(const struct bp_doc *doc, const char *key, long long fallback) {
    size_t object = bp_lookup(doc, key);
    int64_t value;
    if (object == (size_t)-1) return fallback;
    if (bp_integer(doc, object, &value) != 0) launch_failed("profile: %s must be an integer or boolean", key);
    return value;
}

// MARK: Timings (profile key Timings: the bench's per-layer cost)

static int timings;
static struct { const char *step; long long ns; } marks[48];
static int mark_count;
static char timing_text[48][48];
static const char *timing_items[48];

/// Notes that `step` ends now (with Timings; a clock read is a system call here, so only when asked).
void mark(const char *step) {
    if (!timings || mark_count >= 48) return;
    struct timespec t;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &t);
    marks[mark_count].step = step;
    marks[mark_count++].ns = (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/// "step microseconds" for each step since the previous mark; returns how many.
static size_t timing_entries(void) {
    size_t n = 0;
    for (int i = 1; i < mark_count; i++, n++) {
        snprintf(timing_text[n], sizeof timing_text[n], "%s %lld", marks[i].step, (marks[i].ns - marks[i - 1].ns) / 1000);
        timing_items[n] = timing_text[n];
    }
    return n;
}

static void read_profile(void) {
    static uint8_t bytes[MAX_PROFILE_BYTES];
    size_t length = 0;
    for (;;) {
        ssize_t n = read(PROFILE_FD, bytes + length, sizeof bytes - length);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) launch_failed("profile: cannot read descriptor %d: %s", PROFILE_FD, strerror(errno));
        if (n == 0) break;
        length += (size_t)n;
        if (length == sizeof bytes) launch_failed("profile: larger than %d bytes", MAX_PROFILE_BYTES);
    }
    struct bp_doc doc;
    const char *why;
    if (bp_open(&doc, bytes, length, &why) != 0) launch_failed("profile: %s", why);
    profile.extension = string_for(&doc, "Extension", 1);
    profile.executable = string_for(&doc, "Executable", 1);
    struct paths argv = paths_for(&doc, "Arguments"), envp = paths_for(&doc, "Environment");
    if (argv.count == 0) launch_failed("profile: Arguments is empty");
    profile.argv = argv.items;
    static char *no_environment[] = {NULL};
    profile.envp = envp.items ? envp.items : no_environment;
    profile.host_pid = integer_for(&doc, "HostPID", 0);
    char *mode = string_for(&doc, "Sandbox", 1);
    if (strcmp(mode, "strict") == 0) profile.mode = SANDBOX_STRICT;
    else if (strcmp(mode, "bestEffort") == 0) profile.mode = SANDBOX_BEST_EFFORT;
    else if (strcmp(mode, "none") == 0) profile.mode = SANDBOX_NONE;
    else launch_failed("profile: Sandbox '%s' is not strict, bestEffort or none", mode);
    profile.network = integer_for(&doc, "NetworkAllowed", 0) != 0;
    profile.subprocesses = integer_for(&doc, "AllowSubprocesses", 0) != 0;
    profile.memory_mb = integer_for(&doc, "MemoryLimitMB", 0);
    profile.descriptors = integer_for(&doc, "DescriptorLimit", 0);
    profile.executable_paths = paths_for(&doc, "ExecutablePaths");
    profile.runtime = paths_for(&doc, "RuntimePaths");
    // A root launcher's worker runs as WorkerUID/WorkerGID; any other launcher's as its own ids.
    long long worker_uid = integer_for(&doc, "WorkerUID", 65534), worker_gid = integer_for(&doc, "WorkerGID", 65534);
    if (worker_uid < 0 || worker_uid > 0xFFFFFFFELL || worker_gid < 0 || worker_gid > 0xFFFFFFFELL)
        launch_failed("profile: WorkerUID and WorkerGID must be ids");
    profile.mapped_uid = geteuid() == 0 ? (unsigned)worker_uid : geteuid();
    profile.mapped_gid = geteuid() == 0 ? (unsigned)worker_gid : getegid();
    profile.temp_mb = integer_for(&doc, "TempSizeMB", 64);
    profile.max_threads = integer_for(&doc, "MaxThreads", 512);
    profile.readable = paths_for(&doc, "ReadablePaths");
    profile.writable = paths_for(&doc, "WritablePaths");
    profile.masked = paths_for(&doc, "MaskedPaths");
    profile.executable_sha256 = string_for(&doc, "ExecutableSHA256", 0);
    timings = integer_for(&doc, "Timings", 0) != 0;
    profile.shared_network = integer_for(&doc, "SharedNetworkNamespace", 0) != 0 && !profile.network;
    profile.device_folder = string_for(&doc, "DeviceFolder", 0);
    profile.root_templates = string_for(&doc, "RootTemplates", 0);
    profile.worker_folder = string_for(&doc, "WorkerFolder", 0);
    profile.root_templates_fd = -1;
    mark("start");
    if (profile.executable_sha256 && strlen(profile.executable_sha256) != 64)
        launch_failed("profile: ExecutableSHA256 must be 64 hex digits");
}

/// With ExecutableSHA256: opens the executable (in the worker's root, once it has one), hashes what it reads,
/// and from then on execs that descriptor (/proc/self/fd/N), never the path again, so that what was checked is
/// what runs. Must run before seccomp, which allows only the exec of `profile.executable`'s pointer.
static void verify_executable(void) {
    if (!profile.executable_sha256) return;
    int fd = open(profile.executable, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);  /* a FIFO: no wait */
    if (fd < 0) launch_failed("ExecutableSHA256: cannot open %s: %s", profile.executable, strerror(errno));
    struct stat info;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) launch_failed("ExecutableSHA256: %s is not a file", profile.executable);
    char actual[65];
    int error = sha256_descriptor(fd, actual);
    if (error) launch_failed("ExecutableSHA256: cannot read %s: %s", profile.executable, strerror(error));
    char expected[65];
    for (int i = 0; i < 65; i++) {
        char c = profile.executable_sha256[i];
        expected[i] = (c >= 'A' && c <= 'F') ? (char)(c - 'A' + 'a') : c;
    }
    if (strcmp(actual, expected) != 0)
        launch_failed("ExecutableSHA256: %s has SHA-256 %s, not the manifest's %s", profile.executable, actual, expected);
    static char by_descriptor[32];
    snprintf(by_descriptor, sizeof by_descriptor, "/proc/self/fd/%d", fd);
    profile.executable = by_descriptor;
}

// MARK: Layers in the launcher


static void close_other_descriptors(int from) {
    if (syscall(SYS_close_range, from, ~0U, 0) == 0) return;
    long max = sysconf(_SC_OPEN_MAX);
    for (int fd = from; fd < (max > 0 ? max : 1024); fd++) close(fd);
}

static void set_limit(int resource, rlim_t value, const char *name) {
    struct rlimit limit = {.rlim_cur = value, .rlim_max = value};
    struct rlimit current;
    // Never raise: an rlimit the host already runs under stays (raising needs a privilege we drop anyway).
    if (getrlimit(resource, &current) == 0 && current.rlim_max != RLIM_INFINITY && current.rlim_max < value)
        limit.rlim_cur = limit.rlim_max = current.rlim_max;
    if (setrlimit(resource, &limit) != 0) launch_failed("rlimits: cannot set %s: %s", name, strerror(errno));
}

static void apply_rlimits(void) {
    set_limit(RLIMIT_CORE, 0, "RLIMIT_CORE");
    if (profile.memory_mb > 0) {
        rlim_t bytes = (rlim_t)profile.memory_mb << 20;
        // Address space counts every mapping: anonymous, shared and memfd alike (RLIMIT_DATA does not).
        set_limit(RLIMIT_AS, bytes, "RLIMIT_AS");
        // A file (a memfd, a file in TMPDIR) can hold no more than the memory limit either.
        set_limit(RLIMIT_FSIZE, bytes, "RLIMIT_FSIZE");
    }
    if (profile.descriptors > 0) set_limit(RLIMIT_NOFILE, (rlim_t)profile.descriptors, "RLIMIT_NOFILE");
    applied("rlimits");
}

/// Dies with the host; exits at once if the host is already gone (the launcher's parent is no longer it).
static void die_with_host(void) {
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (profile.host_pid > 0 && getppid() != (pid_t)profile.host_pid) _exit(0);
}

/// In the worker: die with the launcher; exit at once if it is already gone (`alive` is the read end of a
/// pipe whose only writer is the launcher, so end-of-file means it has exited).
static void die_with_launcher(int alive) {
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    struct pollfd pfd = {.fd = alive, .events = POLLIN};
    if (poll(&pfd, 1, 0) != 0) _exit(0);
}

static volatile pid_t worker_pid;
/// The worker's exit-notice page (descriptor 5), mapped by the launcher to leave the worker's status in its
/// second word (`ExitNoticePage.launcherStatus`); NULL when there is none.
static unsigned *notice_page;

/// Maps the exit-notice page (descriptor 5). Every argument is a long: `syscall` reads six longs, and the
/// sixth (the offset) is passed on the stack, where an int literal leaves the upper half of its slot as it was.
/// It was, once: a garbage offset mapped past the memfd's end, and the launcher's store of the worker's status
/// there died of SIGBUS, reported as the worker's signal (only when the call's neighbours left the slot dirty).
static void *map_notice_page(void) {
    return (void *)syscall(SYS_mmap, 0L, 4096L, (long)(PROT_READ | PROT_WRITE), (long)MAP_SHARED, (long)NOTICE_FD, 0L);
}

static void forward_signal(int sig) {
    if (worker_pid > 0) kill(worker_pid, sig);
}

/// Whether the launcher is a child subreaper (`fork_as_subreaper`): what the worker leaves behind is its own.
static int subreaper;

/// The decimal numbers in `text` that a space or a newline ends (one cut short at the buffer's end is not one:
/// a prefix of a pid is another pid), each SIGKILLed; returns how many.
static int kill_listed(const char *text) {
    int killed = 0;
    long pid = -1;
    for (const char *c = text; *c; c++) {
        if (*c >= '0' && *c <= '9') {
            pid = (pid < 0 ? 0 : pid) * 10 + (*c - '0');
        } else {
            if ((*c == ' ' || *c == '\n') && pid > 0) killed += kill((pid_t)pid, SIGKILL) == 0;
            pid = -1;
        }
    }
    return killed;
}

/// Whether the stat line of a process ("pid (comm) state ppid ...") names `parent` as its parent. comm may hold
/// spaces and parentheses: the last ')' ends it.
static int stat_has_parent(const char *text, pid_t parent) {
    const char *end = NULL;
    for (const char *c = text; *c; c++) if (*c == ')') end = c;
    if (!end || end[1] != ' ' || !end[2] || end[3] != ' ') return 0;
    long ppid = 0;
    const char *c = end + 4;
    if (*c < '0' || *c > '9') return 0;
    for (; *c >= '0' && *c <= '9'; c++) ppid = ppid * 10 + (*c - '0');
    return *c == ' ' && ppid == parent;
}

/// The launcher's children now, SIGKILLed; returns how many. Read from /proc/self/task/<tid>/children (the
/// launcher has one thread), else from every process's stat (a kernel without CONFIG_PROC_CHILDREN). A child
/// cannot be reaped (nor its pid reused) before this process waits for it, so no other process is signalled.
static int kill_children(void) {
    static char text[65536];
    char path[64];
    pid_t self = getpid();
    snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)self);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        size_t length = 0;
        for (ssize_t n; length < sizeof text - 1 && (n = read(fd, text + length, sizeof text - 1 - length)) != 0;) {
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) break;
            length += (size_t)n;
        }
        close(fd);
        text[length] = 0;
        return kill_listed(text);
    }
    int proc = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (proc < 0) return 0;
    static char entries[32768] __attribute__((aligned(8)));
    int killed = 0;
    for (long n; (n = syscall(SYS_getdents64, proc, entries, sizeof entries)) > 0;) {
        for (long at = 0; at < n;) {
            // struct linux_dirent64: inode (8 bytes), offset (8), record length (2), type (1), name.
            unsigned short length;
            memcpy(&length, entries + at + 16, sizeof length);
            const char *name = entries + at + 19;
            at += length;
            if (name[0] < '1' || name[0] > '9') continue;
            snprintf(path, sizeof path, "/proc/%.24s/stat", name);
            int stat_fd = open(path, O_RDONLY | O_CLOEXEC);
            if (stat_fd < 0) continue;
            ssize_t got = read(stat_fd, text, 1023);
            close(stat_fd);
            if (got <= 0) continue;
            text[got] = 0;
            if (stat_has_parent(text, self)) {
                long pid = 0;
                for (const char *c = name; *c >= '0' && *c <= '9'; c++) pid = pid * 10 + (*c - '0');
                killed += kill((pid_t)pid, SIGKILL) == 0;
            }
        }
    }
    close(proc);
    return killed;
}

/// Kills and reaps every process left under the launcher. As a subreaper it is the parent of each process the
/// worker left behind (one in a session of its own, a daemon that forked twice), and of each one's children
/// when that one dies: kill what is there, wait for one to end, and again, until no child is left.
/// A child that dies has had its own children reparented to the launcher first, so an empty list means no
/// descendant is left; one the launcher cannot list (no /proc) is not waited for forever.
static void kill_descendants(void) {
    for (;;) {
        int killed = kill_children();
        pid_t reaped = waitpid(-1, NULL, killed ? 0 : WNOHANG);
        if (reaped > 0 || (reaped < 0 && errno == EINTR)) continue;
        return;
    }
}

/// The launcher as supervisor: waits for the worker, kills the namespace (or, as a subreaper, every process the
/// worker left), and exits the way the worker did.
static void supervise(pid_t init) {
    static const int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT};
    struct sigaction action = {.sa_handler = forward_signal};
    sigemptyset(&action.sa_mask);
    for (unsigned i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++) sigaction(forwarded[i], &action, NULL);
    // The worker's status is read first without reaping it: while it is a zombie the host can still read its
    // /proc/<pid>/stat (ExitNotice.swift). It goes into the exit-notice page as well, for a host that looks only
    // after the reap below. A subreaper reaps the worker's orphans as they end meanwhile.
    siginfo_t info;
    for (;;) {
        memset(&info, 0, sizeof info);
        if (syscall(SYS_waitid, subreaper ? P_ALL : P_PID, subreaper ? 0 : worker_pid, &info, WEXITED | WNOWAIT, NULL) < 0) {
            if (errno == EINTR) continue;
            _exit(LAUNCH_FAILED_STATUS);
        }
        if (info.si_pid == worker_pid) break;
        while (waitpid(info.si_pid, NULL, 0) < 0 && errno == EINTR) {}
    }
    // No more forwarding: once reaped below, its pid may be another process's.
    pid_t worker = worker_pid;
    worker_pid = 0;
    int status = info.si_code == CLD_EXITED ? (info.si_status & 0xFF) << 8
               : (info.si_status & 0x7F) | (info.si_code == CLD_DUMPED ? 0x80 : 0);
    if (notice_page) __atomic_store_n(&notice_page[1], 0x80000000U | (unsigned)status, __ATOMIC_RELEASE);
    while (waitpid(worker, NULL, 0) < 0 && errno == EINTR) {}
    if (init > 0) {
        kill(init, SIGKILL);
        while (waitpid(init, NULL, 0) < 0 && errno == EINTR) {}
    }
    if (subreaper) kill_descendants();
    if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
    int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    kill(getpid(), sig);
    _exit(128 + sig);
}

/// The worker's pid as the host sees it (the launcher's namespace), sent in `sandboxed`: inside, it is 2. Empty
/// where the worker is not in namespaces of its own.
static char worker_pid_text[24];
/// In the worker: whether it runs in its own namespaces (and so builds its root).
static int namespaced;
static int in_namespaces(void) { return namespaced; }
/// In the worker: the read end of the launcher's `alive` pipe (end-of-file once the launcher has exited).
static int launcher_alive = -1;
/// The worker's stack while it confines itself. The worker shares the launcher's memory until its execve
/// (CLONE_VM | CLONE_VFORK, as posix_spawn does): no page tables to copy, and the launcher sleeps meanwhile.
static unsigned char worker_stack[262144] __attribute__((aligned(16)));

static void confine_and_exec(void);

/// The worker's start: pid 2 of its namespaces and the launcher's child (so its exit status and signals are the
/// launcher's to forward). `worker_pid` already holds its pid outside (CLONE_PARENT_SETTID).
static void worker_main(void *alive) {
    int *ends = alive;
    close(ends[1]);
    die_with_launcher(ends[0]);
    launcher_alive = ends[0];
    namespaced = 1;
    snprintf(worker_pid_text, sizeof worker_pid_text, "%d", (int)worker_pid);
    mark("fork");
    if (setsid() < 0) launch_failed("session: setsid failed: %s", strerror(errno));
    confine_and_exec();
}

/// The launcher once it has cloned `worker` (in namespaces around `init`, or as its subreaping parent, `init` 0):
/// it maps the exit-notice page and keeps none of the worker's channels, so the host sees end-of-file when the
/// worker ends (`alive_write`, the write end of the `alive` pipe, stays open until the launcher exits); then it
/// supervises. Never returns.
static void supervise_worker(pid_t worker, int alive_write, pid_t init) {
    worker_pid = worker;
    void *page = map_notice_page();
    if (page != (void *)-1L) notice_page = page;
    if (alive_write > 0) syscall(SYS_close_range, 0L, (long)alive_write - 1, 0L);
    syscall(SYS_close_range, (long)alive_write + 1, (long)~0U, 0L);
    supervise(init);
}

/// The worker's start as the child of a subreaping launcher (`fork_as_subreaper`): no namespaces, its pid the
/// same inside and out, and sent to the host all the same (the host's child is the launcher).
static void subreaped_worker_main(void *alive) {
    int *ends = alive;
    close(ends[1]);
    die_with_launcher(ends[0]);
    launcher_alive = ends[0];
    snprintf(worker_pid_text, sizeof worker_pid_text, "%d", (int)worker_pid);
    mark("fork");
    if (setsid() < 0) launch_failed("session: setsid failed: %s", strerror(errno));
    confine_and_exec();
}

/// Where no pid namespace holds the worker (`Sandbox none`, or bestEffort where none could be made), its end
/// would not take the processes it started with it: one in a session of its own outlived it. The launcher stays
/// as its parent and a child subreaper (PR_SET_CHILD_SUBREAPER), so that every process the worker leaves behind is
/// reparented to the launcher rather than to init, and is killed when the worker ends (`supervise`). Returns
/// only where that cannot be had (the launcher then execs the extension itself, as before, and says so).
static void fork_as_subreaper(void) {
    static int alive[2];
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
        note("subreaper: prctl(PR_SET_CHILD_SUBREAPER) refused (%s): processes the worker starts may outlive it", strerror(errno));
        return;
    }
    if (pipe2(alive, O_CLOEXEC) != 0) {
        note("subreaper: pipe (%s): processes the worker starts may outlive it", strerror(errno));
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
        return;
    }
    subreaper = 1;
    applied("subreaper");
    // Returns once the worker has exec'd the extension or exited.
    pid_t worker = clone_onto(CLONE_VM | CLONE_VFORK | CLONE_PARENT_SETTID | SIGCHLD, worker_stack + sizeof worker_stack,
                              (int *)&worker_pid, subreaped_worker_main, alive);
    if (worker < 0) {
        // No worker of its own (EAGAIN at RLIMIT_NPROC, or a bestEffort launcher left half in namespaces it could
        // not finish): exec the extension itself, as without a subreaper, and say so.
        int error = errno;
        close(alive[0]);
        close(alive[1]);
        subreaper = 0;
        if (layer_count > 0 && strcmp(layers[layer_count - 1], "subreaper") == 0) layer_count--;
        worker_pid = 0;
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
        note("subreaper: cannot start the worker as its child (%s): processes the worker starts may outlive it", strerror(error));
        return;
    }
    supervise_worker(worker, alive[1], 0);
}

/// Makes the worker's namespaces around a new pid 1 (`init`), joins them, and clones the worker into them; the
/// launcher then supervises. Returns only where a bestEffort launch goes on without namespaces.
static void fork_into_namespace(void) {
    static int alive[2];
    if (pipe2(alive, O_CLOEXEC) != 0) launch_failed("sandbox: namespaces unavailable: pipe (%s)", strerror(errno));
    const char *why = NULL;
    pid_t init = 0;
    mark("session+rlimits");
    int error = 0;
    if (profile.shared_network) {
        // Joined here, while the launcher still holds its capabilities in the host's user namespace; the new
        // namespaces below are made without a network namespace of their own, and inherit this one.
        if (syscall(SYS_setns, NETWORK_NAMESPACE_FD, CLONE_NEWNET) != 0) {
            error = errno;
            why = "setns into the host's shared network namespace refused";
        }
        close(NETWORK_NAMESPACE_FD);
    }
    open_root_templates(&profile);
    if (error == 0) error = make_namespaces(&profile, alive[0], &init, &why);
    mark("namespaces");
    if (error != 0) {
        close(alive[0]);
        close(alive[1]);
        unavailable("namespaces", error, why);
        return;
    }
    applied("userNamespace");
    applied("pidNamespace");
    // Returns once the worker has exec'd the extension or exited.
    pid_t worker = clone_onto(CLONE_VM | CLONE_VFORK | CLONE_PARENT_SETTID | SIGCHLD, worker_stack + sizeof worker_stack,
                              (int *)&worker_pid, worker_main, alive);
    if (worker < 0) {
        kill(init, SIGKILL);
        launch_failed("sandbox: pidNamespace unavailable: cannot start the worker (%s)", strerror(errno));
    }
    supervise_worker(worker, alive[1], init);
}

/// Every environment entry but TMPDIR, then TMPDIR=/tmp: the worker's own tmpfs in its new root.
static void point_tmpdir_at_root_tmp(void) {
    static char *entries[1024];
    size_t n = 0;
    for (char **e = profile.envp; *e && n < 1022; e++)
        if (strncmp(*e, "TMPDIR=", 7) != 0) entries[n++] = *e;
    entries[n++] = "TMPDIR=/tmp";
    entries[n] = NULL;
    profile.envp = entries;
}

// MARK: Layers in the worker, then exec

static void confine_and_exec(void) {
    if (profile.mode != SANDBOX_NONE) {
        const char *why = NULL;
        int error;
        if (in_namespaces()) {
            static char missing[1024];
            applied(profile.network ? "mount, IPC and UTS namespaces" : "mount, IPC, UTS and network namespaces");
            error = collect_grants(&profile, missing, sizeof missing, &why);
            if (error) unavailable("root", error, why);
            // The worker's uid next: files and mounts it makes in its new root must be owned by an id its user
            // namespace maps. It keeps its capabilities inside that namespace until they are dropped below.
            mark("grants");
            int user_error = become_worker_user(&profile, &why);
            mark("workerUser");
            if (user_error == 0) applied("workerUser");
            else unavailable("workerUser", user_error, why);
            // A change of credentials clears the parent-death signal: set it again, and make sure the launcher
            // did not die in between (its pid is not in this namespace: the pipe tells).
            die_with_launcher(launcher_alive);
            if (error == 0 && user_error == 0) {
                error = build_root(&profile, &why);
                mark("root");
                if (error == 0) {
                    applied("root");
                    profile.root_built = 1;
                    point_tmpdir_at_root_tmp();
                    if (missing[0]) note("grants not found: %.480s", missing);
                } else {
                    unavailable("root", error, why);
                }
            }
            if (profile.max_threads > 0) set_limit(RLIMIT_NPROC, (rlim_t)profile.max_threads, "RLIMIT_NPROC");
        } else if (geteuid() == 0) {
            // No namespaces (bestEffort, where none could be made): a root host's worker still never runs as
            // root. Its TMPDIR, a folder the host made for it, is WorkerUser's already (SandboxProfile.spawn).
            int user_error = syscall(SYS_setgroups, 0, NULL) == 0 ? become_worker_user(&profile, &why) : errno;
            if (user_error == 0) applied("workerUser");
            else unavailable("workerUser", user_error, why ? why : "setgroups(0) refused");
            // A change of credentials clears the parent-death signal: set it again, and check its parent (the
            // host, or the subreaping launcher) is there.
            if (launcher_alive >= 0) die_with_launcher(launcher_alive);
            else die_with_host();
        }
    }
    verify_executable();
    if (profile.executable_sha256) mark("executableSHA256");
    if (profile.mode != SANDBOX_NONE) {
        const char *why = NULL;
        int error;
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0) applied("noNewPrivs");
        else unavailable("noNewPrivs", errno, "prctl(PR_SET_NO_NEW_PRIVS) refused");
        error = drop_capabilities(&why);
        if (error == 0) applied("capabilities");
        else unavailable("capabilities", error, why);
        int abi = 0;
        static char missing[1024];
        static char landlock_name[32];
        mark("noNewPrivs+capabilities");
        error = apply_landlock(&profile, &abi, missing, sizeof missing, &why);
        mark("landlock");
        if (error == 0) {
            snprintf(landlock_name, sizeof landlock_name, "landlock:%d", abi);
            applied(landlock_name);
            // In its own root a missing grant was noted already, when the root was built.
            if (missing[0] && !in_namespaces()) note("paths not found: %.480s", missing);
        } else {
            unavailable("landlock", error, why);
        }
        error = apply_seccomp(&profile, getpid(), &why);
        mark("seccomp");
        if (error == 0) applied("seccomp");
        else unavailable("seccomp", error, why);
    }
    struct bp_entry entries[] = {
        {.key = "type", .string = "sandboxed"},
        {.key = "layers", .strings = layers, .count = layer_count},
        {.key = "skipped", .strings = skipped, .count = skipped_count},
        {.key = "pid", .string = worker_pid_text},
        {.key = NULL},
    };
    size_t count = worker_pid_text[0] ? 4 : 3;
    if (timings) entries[count++] = (struct bp_entry){.key = "timings", .strings = timing_items, .count = timing_entries()};
    send_frame(entries, count);
    execve(profile.executable, profile.argv, profile.envp);
    int error = errno;
    launch_failed("cannot exec %s: %s", profile.executable, strerror(error));
}

int doctor(void);

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--doctor") == 0) return doctor();
    read_profile();
    // Descriptor 5, when open, is the worker's exit-notice page (SDKHOST_EXIT_NOTICE_FD): it passes through.
    close(PROFILE_FD);
    // Descriptor 6, with SharedNetworkNamespace, is the host's empty network namespace: joined below.
    close_other_descriptors(profile.shared_network ? NETWORK_NAMESPACE_FD + 1 : NOTICE_FD + 1);
    // New session: posix_spawn made us a session leader already (POSIX_SPAWN_SETSID); make sure of it.
    if (getsid(0) != getpid() && setsid() < 0) launch_failed("session: setsid failed: %s", strerror(errno));
    applied("session");
    die_with_host();
    applied("parentDeathSignal");
    apply_rlimits();
    if (profile.mode != SANDBOX_NONE) fork_into_namespace();
    fork_as_subreaper();
    confine_and_exec();
}
