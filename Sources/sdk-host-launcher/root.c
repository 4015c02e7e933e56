// The worker's world, by construction: new namespaces (user, pid, mount, IPC, UTS and, without NetworkAllowed,
// network) and a root that holds only the profile's grants (bubblewrap's and nsjail's shape, written for this
// launcher). Nothing of the machine is reachable from the worker unless it was bound into its root: no other
// process can be named, no other mount is visible, no path outside the grants resolves.
//
// The root is mounted over /tmp in the worker's own mount namespace: a read-only clone of a template (below) or,
// without one, a small tmpfs. Each grant's source is opened (a detached clone, or O_PATH) before anything is
// mounted and before the worker takes its own uid (a grant is the operator's: the folders above it need not be
// open to the worker's uid), so that a grant under /tmp, or reached through a symbolic link, is bound from what it
// was on the host and not from what the new mounts show. The worker's TMPDIR, a tmpfs of TempSizeMB, goes in
// first (a grant under /tmp is bound inside it), then the grants, /dev/null, /dev/zero, /dev/random, /dev/urandom
// and /proc (a new instance: only the worker's own pid namespace). pivot_root makes it the root, the old root is
// detached, and the new root is read-only.
//
// MaskedPaths (an interpreted worker's: the machine's Python package folders) are each covered by an empty tmpfs,
// read-only once the grants are in place (a grant inside one is bound into it first).
//
// Grants are bound read-only (ReadablePaths and the runtime folders; ReadablePaths and everything writable also
// noexec), WritablePaths read-write; every bind is nosuid and nodev (but the four device nodes), and keeps the
// flags its source mount has locked (a remount in a user namespace may not clear them).
//
// Root templates. With RootTemplates (a folder of a root host's, mode 0700: its workers, never root, cannot
// enter it), the root's mount points are not made anew for each worker (a mkdir costs ~4 us here, and a usual
// root needs twenty): the root is a read-only clone of a template, a folder holding only the empty mount points
// of one set of grants (folders, empty files, the links of a merged /usr), built by the first worker that needs it
// under a random name, renamed into place, and named by the SHA-256 of what it holds. Each clone is checked whole
// before it is used (one found damaged is set aside, never removed, and built again), and a template's times are
// set to now once a day when it is used, so that a cleaner of old temporary files leaves a template in use alone. A grant inside another grant or inside TMPDIR has its
// mount point made as it is bound, as without a template; where one would need a mount point made in the
// read-only template (under /proc, or under a mask alone), the root is a tmpfs for that launch.
#define _GNU_SOURCE
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <linux/mount.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROOT "/tmp"
#define MAX_GRANTS 256

enum grant_kind { GRANT_RUNTIME, GRANT_EXECUTABLE, GRANT_READ, GRANT_WRITE, GRANT_DEVICE, GRANT_DEVICES, GRANT_MASK };

struct grant {
    const char *path;   // where it goes in the new root
    const char *source; // what is bound there: `path` on the host, unless said otherwise
    enum grant_kind kind;
    int fd;           // a detached clone of the source (open_tree), or O_PATH on it where the kernel has no
                      // open_tree; made before any mount
    int cloned;       // fd is a detached clone with its mount flags set, attached with move_mount
    int directory;    // the source is a folder
    char link[256];   // a relative symbolic link without "..", copied as a link instead of bound
    int absent;       // a masked folder that is not in the new root: nothing was mounted
    int templated;    // its mount point (or copied link) is in the root's template, not made at each launch
};

static struct grant grants[MAX_GRANTS];
static size_t grant_count;
/// A read-only clone of the root's template (RootTemplates), attached as the new root; -1: a tmpfs root.
static int template_fd = -1;

static int fail(const char **why, const char *text, int error) {
    *why = text;
    return error ? error : EINVAL;
}

/// An absolute path with no "." or ".." component and no empty one but the leading slash.
static int clean_path(const char *path) {
    if (path[0] != '/' || strlen(path) >= 3072) return 0;
    for (const char *p = path; *p;) {
        while (*p == '/') p++;
        const char *end = p;
        while (*end && *end != '/') end++;
        size_t n = (size_t)(end - p);
        if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return 0;
        p = end;
    }
    return 1;
}

#ifndef SYS_open_tree_attr
#define SYS_open_tree_attr 467
#endif

/// What a grant's bind adds to its source mount's flags: nosuid always; nodev but for the device nodes; read-only
/// but for WritablePaths and the single device nodes; noexec for all but the executable and the runtime folders.
static struct mount_attr grant_attr(enum grant_kind kind) {
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_NOSUID};
    switch (kind) {
    case GRANT_RUNTIME: case GRANT_EXECUTABLE: attr.attr_set |= MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV; break;
    case GRANT_READ: attr.attr_set |= MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC; break;
    case GRANT_WRITE: attr.attr_set |= MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC; break;
    case GRANT_DEVICE: break;
    case GRANT_DEVICES: attr.attr_set |= MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOEXEC; break;  // no new node in /dev
    case GRANT_MASK: break;  // not a bind (`mask`)
    }
    return attr;
}

/// A detached clone of what `path` names now, restricted by `attr` as it is made (Linux 6.15's open_tree_attr: one
/// system call instead of a bind through /proc/self/fd and a remount). Where that call is missing or refused (an
/// older kernel, a filter that refuses numbers it does not know), open_tree and mount_setattr (5.12) do the same in
/// two. A path that is not there (or not the caller's to reach) is the same answer whichever call gives it.
/// Returns the descriptor, or -1 with errno set.
static int clone_restricted(const char *path, struct mount_attr *attr) {
    int fd = (int)syscall(SYS_open_tree_attr, AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC, attr, sizeof *attr);
    if (fd >= 0 || errno == ENOENT || errno == ENOTDIR || errno == EACCES || errno == ELOOP) return fd;
    fd = (int)syscall(SYS_open_tree, AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (fd >= 0 && syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH, attr, sizeof *attr) != 0) {
        int error = errno;
        close(fd);
        fd = -1;
        errno = error;
    }
    return fd;
}

/// Opens `source` (NULL: `path`) as the grant of `path`. Returns whether it was added (a missing or unclean
/// path is noted in `skipped`).
static int add_grant_from(const char *source, const char *path, enum grant_kind kind, char *skipped, size_t skipped_size) {
    if (grant_count >= MAX_GRANTS) return 0;
    struct grant *g = &grants[grant_count];
    memset(g, 0, sizeof *g);
    g->path = path;
    g->source = source ? source : path;
    g->kind = kind;
    g->fd = -1;
    if (!clean_path(path) || !clean_path(g->source)) {
        note_skipped(skipped, skipped_size, path, EINVAL);
        return 0;
    }
    path = g->source;
    struct stat info;
    // A folder reached by a short relative link (merged /usr's /lib -> usr/lib) is copied as that link; the
    // executable itself is always bound, as what it resolves to.
    if (kind != GRANT_EXECUTABLE && syscall(SYS_newfstatat, AT_FDCWD, path, &info, AT_SYMLINK_NOFOLLOW) == 0
        && S_ISLNK(info.st_mode)) {
        long n = syscall(SYS_readlinkat, AT_FDCWD, path, g->link, sizeof g->link - 1);
        if (n > 0 && g->link[0] != '/' && strstr(g->link, "..") == NULL) {
            g->link[n] = 0;
            grant_count++;
            return 1;
        }
        g->link[0] = 0;
    }
    // A detached clone, restricted as it is made; without the new mount API at all, an O_PATH descriptor bound and
    // remounted later.
    struct mount_attr attr = grant_attr(kind);
    g->fd = clone_restricted(path, &attr);
    g->cloned = g->fd >= 0;
    if (g->fd < 0 && errno == ENOSYS) g->fd = open(path, O_PATH | O_CLOEXEC);
    if (g->fd < 0) {
        note_skipped(skipped, skipped_size, path, errno);
        return 0;
    }
    if (fstat(g->fd, &info) != 0) {
        note_skipped(skipped, skipped_size, path, errno);
        close(g->fd);
        return 0;
    }
    g->directory = S_ISDIR(info.st_mode);
    grant_count++;
    return 1;
}

static int add_grant(const char *path, enum grant_kind kind, char *skipped, size_t skipped_size) {
    return add_grant_from(NULL, path, kind, skipped, skipped_size);
}

/// The longest folder (inside the new root) known to exist: the last target's parent, or the last folder
/// target. Grants are bound in path order, so a grant's parents are mostly the previous grant's.
static char made[4096];
static size_t made_length;

/// Whether the first `n` bytes of `path` name `made` or a folder inside it.
static int already_made(const char *path, size_t n) {
    return n <= made_length && strncmp(path, made, n) == 0 && (made[n] == '/' || made[n] == 0);
}

static void remember_made(const char *path, size_t n) {
    if (n >= sizeof made) return;
    memcpy(made, path, n);
    made[n] = 0;
    made_length = n;
}

/// Makes every folder of `path` (inside the new root) up to, not including, its last component.
static int make_parents(char *path) {
    char *last = NULL;
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        last = p;
        size_t n = (size_t)(p - path);
        if (already_made(path, n)) continue;
        *p = 0;
        int rc = (int)syscall(SYS_mkdirat, AT_FDCWD, path, 0755);
        int error = errno;
        *p = '/';
        if (rc != 0 && error != EEXIST) return error;
    }
    if (last) remember_made(path, (size_t)(last - path));
    return 0;
}

/// Makes the mount point `target`, unless it is there already (inside a grant bound before it, or a path
/// granted twice). Making it says whether it was there: the usual target costs no stat.
static int make_target(char *target, int directory) {
    struct stat info;
    int error = make_parents(target);
    if (error) return error;
    if (directory) {
        if (syscall(SYS_mkdirat, AT_FDCWD, target, 0755) != 0 && errno != EEXIST) return errno;
        remember_made(target, strlen(target));
        return 0;
    }
    // O_EXCL: an existing target (a file of a granted folder, one reached through a copied link, a path granted
    // twice) is never opened, only found; EEXIST says so.
    int fd = open(target, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        int error = errno;
        if (error == EEXIST || error == EISDIR) return 0;
        if (syscall(SYS_newfstatat, AT_FDCWD, target, &info, AT_SYMLINK_NOFOLLOW) == 0) return 0;
        return error;
    }
    close(fd);
    return 0;
}

/// The flags a bind of `target` must keep when it is remounted: those its source mount has locked.
static unsigned long locked_flags(const char *target) {
    struct statfs info;
    if (syscall(SYS_statfs, target, &info) != 0) return 0;
    return (unsigned long)info.f_flags
        & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME | MS_RELATIME);
}

/// Covers `g->path` (in the new root) with an empty tmpfs; `build_root` makes it read-only later. A folder that is
/// not in the new root (it went away since the host looked) has nothing to hide: it is skipped, never made.
static int mask(struct grant *g, const char **why) {
    static char target[4096];
    snprintf(target, sizeof target, ROOT "%s", g->path);
    struct stat info;
    if (syscall(SYS_newfstatat, AT_FDCWD, target, &info, 0) != 0 || !S_ISDIR(info.st_mode)) {
        g->absent = 1;  // nothing mounted: build_root does not make it read-only
        return 0;
    }
    if (syscall(SYS_mount, "sdk-host-masked", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64") != 0)
        return fail(why, "cannot mask a folder in the new root", errno);
    return 0;
}

static int bind(struct grant *g, const char **why) {
    static char target[4096], source[64];
    if (g->kind == GRANT_MASK) return mask(g, why);
    snprintf(target, sizeof target, ROOT "%s", g->path);
    if (g->templated && g->link[0]) return 0;  // copied into the template
    if (g->link[0]) {
        int error = make_parents(target);
        if (error == 0 && syscall(SYS_symlinkat, g->link, AT_FDCWD, target) != 0 && errno != EEXIST) error = errno;
        return error ? fail(why, "cannot copy a symbolic link into the new root", error) : 0;
    }
    int error = g->templated ? 0 : make_target(target, g->directory);
    if (error) return fail(why, "cannot make a mount point in the new root", error);
    if (g->cloned) {
        // Restricted when it was cloned (flags only added: what the source mount has locked stays set).
        if (syscall(SYS_move_mount, g->fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) != 0)
            return fail(why, "cannot attach a grant in the new root (move_mount)", errno);
        return 0;
    }
    snprintf(source, sizeof source, "/proc/self/fd/%d", g->fd);
    if (syscall(SYS_mount, source, target, NULL, MS_BIND, NULL) != 0)
        return fail(why, "cannot bind a grant into the new root", errno);
    unsigned long flags = MS_REMOUNT | MS_BIND | MS_NOSUID;
    switch (g->kind) {
    case GRANT_RUNTIME: case GRANT_EXECUTABLE: flags |= MS_RDONLY | MS_NODEV; break;
    case GRANT_READ: flags |= MS_RDONLY | MS_NODEV | MS_NOEXEC; break;
    case GRANT_WRITE: flags |= MS_NODEV | MS_NOEXEC; break;
    case GRANT_DEVICE: break;
    case GRANT_DEVICES: flags |= MS_RDONLY | MS_NOEXEC; break;
    case GRANT_MASK: break;
    }
    flags |= locked_flags(target);
    if (syscall(SYS_mount, NULL, target, NULL, flags, NULL) != 0)
        return fail(why, "cannot remount a grant with its restrictions", errno);
    return 0;
}

static int compare_paths(const struct grant *a, const struct grant *b) { return strcmp(a->path, b->path); }

static int write_map(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    ssize_t n = write(fd, text, strlen(text));
    int error = n == (ssize_t)strlen(text) ? 0 : (n < 0 ? errno : EIO);
    close(fd);
    return error;
}

/// What pid 1 is given: the read ends of the launcher's `go` and `alive` pipes.
static struct { int go, alive; } init_pipes;
/// Pid 1's stack. Pid 1 shares the launcher's memory (CLONE_VM: no page tables to copy), so it touches nothing
/// but this stack and makes only raw system calls, which leave the shared `errno` alone.
static unsigned char init_stack[16384] __attribute__((aligned(16)));

#define RAW(n, a, b, c, d) raw_syscall((n), (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)

/// Pid 1 of the worker's namespaces: waits until the launcher has written its maps (end-of-file on `go`), then
/// reaps whatever is reparented to it until the launcher exits or kills it. Its death takes every process of the
/// namespace with it.
static void run_init(void *unused) {
    (void)unused;
    int go = init_pipes.go, alive = init_pipes.alive;
    // Nothing but `go` and `alive` stays open: not the worker's channels, and not this process's copy of the
    // launcher's write end of `alive`, which would keep `alive` from ever reaching end-of-file.
    int low = go < alive ? go : alive, high = go < alive ? alive : go;
    if (low > 0) RAW(SYS_close_range, 0, low - 1, 0, 0);
    if (high > low + 1) RAW(SYS_close_range, low + 1, high - 1, 0, 0);
    RAW(SYS_close_range, high + 1, ~0U, 0, 0);
    char byte;
    while (RAW(SYS_read, go, &byte, 1, 0) == -EINTR) {}
    RAW(SYS_close, go, 0, 0, 0);
    RAW(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0);
    // The launcher may have died before the parent-death signal was set: `alive` is readable only at its end
    // (nothing is ever written to it).
    struct pollfd pfd = {.fd = alive, .events = POLLIN};
    struct timespec now = {0, 0};
    if (RAW(SYS_ppoll, &pfd, 1, &now, NULL) > 0) RAW(SYS_exit_group, 0, 0, 0, 0);
    // SIGCHLD stays blocked and is read from a signalfd, so that one wait sees both a child's death and the
    // launcher's end (`alive` at end-of-file: another copy of its write end, such as the worker's before it
    // closes it, may have outlived the check above).
    unsigned long child = 1UL << (SIGCHLD - 1);
    RAW(SYS_rt_sigprocmask, SIG_BLOCK, &child, NULL, sizeof child);
    int deaths = (int)RAW(SYS_signalfd4, -1, &child, sizeof child, SFD_CLOEXEC | SFD_NONBLOCK);
    // A pid 1 that cannot see its children die would leave them zombies: none at all, then (the worker's start
    // in a namespace without its pid 1 fails, and so does the launch).
    if (deaths < 0) RAW(SYS_exit_group, 0, 0, 0, 0);
    struct pollfd watched[2] = {{.fd = alive, .events = POLLIN}, {.fd = deaths, .events = POLLIN}};
    for (;;) {
        while (RAW(SYS_wait4, -1, NULL, WNOHANG, NULL) > 0) {}
        if (RAW(SYS_ppoll, watched, 2, NULL, NULL) > 0 && watched[0].revents)
            RAW(SYS_exit_group, 0, 0, 0, 0);
        unsigned char drained[128];  // one signalfd_siginfo
        while (RAW(SYS_read, deaths, drained, sizeof drained, 0) > 0) {}
    }
}

/// setns into each of pid 1's namespaces in `flags`, through its /proc files, the user namespace first.
static int join_one_by_one(pid_t init, int flags) {
    static const struct { int flag; const char *name; } order[] = {
        {CLONE_NEWUSER, "user"}, {CLONE_NEWPID, "pid"}, {CLONE_NEWNS, "mnt"}, {CLONE_NEWIPC, "ipc"},
        {CLONE_NEWUTS, "uts"}, {CLONE_NEWNET, "net"},
    };
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        if (!(flags & order[i].flag)) continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/ns/%s", (int)init, order[i].name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return errno;
        int error = syscall(SYS_setns, fd, order[i].flag) == 0 ? 0 : errno;
        close(fd);
        if (error) return error;
    }
    return 0;
}

int make_namespaces(const struct profile *p, int alive, pid_t *init_out, const char **why) {
    uid_t worker_uid = p->mapped_uid;
    gid_t worker_gid = p->mapped_gid;
    if (worker_uid == 0 || worker_gid == 0) return fail(why, "the worker's uid and gid must not be root's", EPERM);
    // Root's supplementary groups would stay with the worker (setgroups is denied inside): drop them first.
    if (geteuid() == 0 && syscall(SYS_setgroups, 0, NULL) != 0) return fail(why, "setgroups(0) refused", errno);
    int go[2];
    if (pipe2(go, O_CLOEXEC) != 0) return fail(why, "pipe", errno);
    // The maps of a new user namespace may name another uid only when a process outside it writes them, so
    // the namespaces are made by a child (pid 1) and mapped from here.
    // Pid 1 lives in every namespace the worker does, so that nothing of the machine can be read through it
    // (/proc/1/mountinfo, /proc/1/net): its mount namespace becomes the worker's new root.
    int flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS;
    if (!p->network && !p->shared_network) flags |= CLONE_NEWNET;
    init_pipes.go = go[0];
    init_pipes.alive = alive;
    int pidfd = -1;
    pid_t init = clone_onto((unsigned long)(flags | CLONE_VM | CLONE_PIDFD | SIGCHLD), init_stack + sizeof init_stack,
                            &pidfd, run_init, NULL);
    if (init < 0) {
        int error = errno;
        close(go[0]);
        close(go[1]);
        return fail(why, "clone(user, pid, mount, IPC, UTS, network namespaces) refused", error);
    }
    close(go[0]);
    char path[64], map[64];
    snprintf(path, sizeof path, "/proc/%d/setgroups", (int)init);
    int error = write_map(path, "deny");
    snprintf(path, sizeof path, "/proc/%d/uid_map", (int)init);
    snprintf(map, sizeof map, "%u %u 1", worker_uid, worker_uid);
    if (error == 0) error = write_map(path, map);
    snprintf(path, sizeof path, "/proc/%d/gid_map", (int)init);
    snprintf(map, sizeof map, "%u %u 1", worker_gid, worker_gid);
    if (error == 0) error = write_map(path, map);
    const char *step = "cannot write the user namespace's uid and gid maps";
    // Every namespace of pid 1 at once (the user namespace first), so that the worker is cloned into them as the
    // launcher's own child, with nothing left to join. Before Linux 5.8 setns takes one namespace file at a time.
    if (error == 0 && syscall(SYS_setns, pidfd, flags) != 0) {
        error = errno == EINVAL ? join_one_by_one(init, flags) : errno;
        step = "setns into pid 1's namespaces refused";
    }
    close(pidfd);
    // Pid 1 shares this memory, and the worker may share the launcher's uid. What keeps the worker from opening
    // it (/proc/1/mem, environ) or tracing it is, besides seccomp and Landlock, that pid 1 holds every capability
    // in their user namespace and the worker none; undumpable memory refuses it whatever the uids and
    // capabilities. Set once the maps are written (an unprivileged launcher writes pid 1's maps as the owner of
    // its /proc files, which this takes away); the extension's own memory after its execve has its own flag.
    if (error == 0 && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
        error = errno;
        step = "prctl(PR_SET_DUMPABLE, 0) refused";
    }
    close(go[1]);  // pid 1 goes on (or, on failure, finds the launcher's pipe still open and is killed below)
    if (error) {
        kill(init, SIGKILL);
        while (waitpid(init, NULL, 0) < 0 && errno == EINTR) {}
        return fail(why, step, error);
    }
    *init_out = init;
    return 0;
}

int become_worker_user(const struct profile *p, const char **why) {
    // The ids inside the namespace are the outer ones (the maps are one-to-one); the process still holds the
    // outer root's ids until it sets them. Group first: a changed uid may no longer change its group.
    if (syscall(SYS_setresgid, p->mapped_gid, p->mapped_gid, p->mapped_gid) != 0)
        return fail(why, "setresgid to the worker's gid refused", errno);
    if (syscall(SYS_setresuid, p->mapped_uid, p->mapped_uid, p->mapped_uid) != 0)
        return fail(why, "setresuid to the worker's uid refused", errno);
    return 0;
}

// MARK: The root's template

void open_root_templates(struct profile *p) {
    p->root_templates_fd = -1;
    // Only where the worker's uid is not the folder's owner: a worker with its host's uid could write into the
    // templates (through a grant that reaches them) and so into every later worker's root.
    if (p->mapped_uid == geteuid()) return;
    if (!p->root_templates || !clean_path(p->root_templates)) return;
    int fd = open(p->root_templates, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat info;
    // The host's own folder, which no one else may enter (0700): a template is trusted to hold only mount points.
    if (fd >= 0 && (fstat(fd, &info) != 0 || info.st_uid != geteuid() || (info.st_mode & 077) != 0)) {
        close(fd);
        fd = -1;
    }
    p->root_templates_fd = fd;
}

/// Whether `path` is `outer` or, when `outer` is a folder (or a link or a mask, which may hold one), inside it.
static int inside(const struct grant *outer, const char *path) {
    size_t n = strlen(outer->path);
    if (strncmp(outer->path, path, n) != 0) return 0;
    if (path[n] == 0) return 1;
    return path[n] == '/' && (outer->directory || outer->link[0] || outer->kind == GRANT_MASK);
}

/// Whether the template can hold `path` plainly: no empty component, not the root itself, at most 24 deep.
static int plain_path(const char *path) {
    if (path[0] != '/' || path[1] == 0 || strstr(path, "//") || path[strlen(path) - 1] == '/') return 0;
    int depth = 0;
    for (const char *c = path; *c; c++) depth += *c == '/';
    return depth <= 24;
}

/// Which grants' mount points the template holds: those on the root itself. A grant left out has its mount point
/// made at each launch where that can be done: inside /tmp (the worker's TMPDIR) or inside a folder or link
/// granted before it. Returns whether the template can serve at all: not when a grant would need its mount point
/// made in the read-only template (one under /proc, or under a mask and no grant), nor when a path is not plain.
static int choose_templated(void) {
    static const struct grant tmp = {.path = "/tmp", .directory = 1}, proc = {.path = "/proc", .directory = 1};
    for (size_t i = 0; i < grant_count; i++) grants[i].templated = 0;
    for (size_t i = 0; i < grant_count; i++) {
        struct grant *g = &grants[i];
        if (g->kind == GRANT_MASK) continue;
        if (!plain_path(g->path)) return 0;
        if (inside(&tmp, g->path)) continue;
        int within = 0, masked = 0;
        for (size_t j = 0; j < i; j++) {
            if (!inside(&grants[j], g->path)) continue;
            if (grants[j].kind == GRANT_MASK) masked = 1;
            else within = 1;
        }
        if (within) continue;
        if (masked || inside(&proc, g->path)) return 0;
        g->templated = 1;
    }
    return 1;
}

/// The template's name: the SHA-256 of each templated grant's kind of mount point, path and link.
static void template_name(char hex[65]) {
    struct sha256 h;
    sha256_start(&h);
    static const char version[] = "sdk-host root template 1\n";
    sha256_add(&h, version, sizeof version - 1);
    for (size_t i = 0; i < grant_count; i++) {
        const struct grant *g = &grants[i];
        if (!g->templated) continue;
        const char *kind = g->link[0] ? "l " : g->directory ? "d " : "f ";
        sha256_add(&h, kind, 2);
        sha256_add(&h, g->path, strlen(g->path) + 1);
        if (g->link[0]) sha256_add(&h, g->link, strlen(g->link) + 1);
        sha256_add(&h, "\n", 1);
    }
    sha256_finish(&h, hex);
}

/// `prefix` and 16 random hex digits (this runtime's snprintf has no %x), in `name` (at least 32 bytes).
static int random_name(char *name, const char *prefix) {
    unsigned char noise[8] = {0};
    if (syscall(SYS_getrandom, noise, sizeof noise, GRND_NONBLOCK) != (long)sizeof noise) return EAGAIN;
    size_t n = strlen(prefix);
    memcpy(name, prefix, n);
    for (int i = 0; i < 8; i++) {
        name[n + 2 * i] = "0123456789abcdef"[noise[i] >> 4];
        name[n + 2 * i + 1] = "0123456789abcdef"[noise[i] & 15];
    }
    name[n + 16] = 0;
    return 0;
}

/// Calls `visit(fd, name, context)` for each entry of the open folder `fd` but "." and "..".
static void each_entry(int fd, void (*visit)(int, const char *, void *), void *context) {
    char buffer[4096];
    long n;
    while ((n = syscall(SYS_getdents64, fd, buffer, sizeof buffer)) > 0) {
        for (long at = 0; at < n;) {
            // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name
            unsigned short length;
            memcpy(&length, buffer + at + 16, sizeof length);
            const char *entry = buffer + at + 19;
            if (strcmp(entry, ".") != 0 && strcmp(entry, "..") != 0) visit(fd, entry, context);
            at += length;
        }
    }
}

enum walk { WALK_REMOVE, WALK_TOUCH };
struct walk_step { int depth; enum walk action; };

static void walk_built(int dir, const char *name, int depth, enum walk action);

static void walk_entry(int dir, const char *name, void *context) {
    const struct walk_step *step = context;
    walk_built(dir, name, step->depth, step->action);
}

/// Removes `name` in `dir` and what it holds (a template this worker built and did not keep, or one found
/// damaged), or sets its times and those of what it holds to now. 32 levels at most: a template's paths are 24.
static void walk_built(int dir, const char *name, int depth, enum walk action) {
    if (action == WALK_REMOVE && (syscall(SYS_unlinkat, dir, name, 0) == 0 || errno != EISDIR)) return;
    struct stat info;
    if (depth <= 32 && syscall(SYS_newfstatat, dir, name, &info, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(info.st_mode)) {
        int fd = (int)syscall(SYS_openat, dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) {
            struct walk_step inside = {depth + 1, action};
            each_entry(fd, walk_entry, &inside);
            close(fd);
        }
    }
    if (action == WALK_REMOVE) syscall(SYS_unlinkat, dir, name, AT_REMOVEDIR);
    else syscall(SYS_utimensat, dir, name, NULL, AT_SYMLINK_NOFOLLOW);
}

/// Makes `path` (relative to `dir`) and the folders above it, as a folder, an empty file or a link.
static int make_in_template(int dir, const char *path, const struct grant *g) {
    char relative[4096];
    while (*path == '/') path++;
    if (!*path) return EINVAL;
    snprintf(relative, sizeof relative, "%s", path);
    for (char *p = relative; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int rc = (int)syscall(SYS_mkdirat, dir, relative, 0755);
        *p = '/';
        if (rc != 0 && errno != EEXIST) return errno;
    }
    long rc;
    if (!g || g->directory) rc = syscall(SYS_mkdirat, dir, relative, 0755);
    else if (g->link[0]) rc = syscall(SYS_symlinkat, g->link, dir, relative);
    else rc = syscall(SYS_mknodat, dir, relative, S_IFREG | 0644, 0);
    return rc == 0 || errno == EEXIST ? 0 : errno;
}

#define MAX_TEMPLATES 256

struct template_count { size_t count; time_t now; };

static void count_template(int folder, const char *name, void *context) {
    struct template_count *tally = context;
    struct stat info;
    // (Never a template set aside as damaged: workers cloned from it may still run, and removing a mount point
    // detaches their mounts.)
    if (strncmp(name, ".building.", 10) == 0
        && syscall(SYS_newfstatat, folder, name, &info, AT_SYMLINK_NOFOLLOW) == 0 && info.st_ctime < tally->now - 3600)
        walk_built(folder, name, 0, WALK_REMOVE);
    else if (name[0] != '.')
        tally->count++;
}

/// Whether the folder has room for another template (MAX_TEMPLATES: the sets of grants a user's hosts launch
/// are few, but a manifest's ReadablePaths are its author's). A half-built template an hour old (its worker was
/// killed while it built; never a clone's source) is removed on the way.
static int room_for_template(int folder) {
    int fd = (int)syscall(SYS_openat, folder, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct timespec now;
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &now);
    struct template_count tally = {0, now.tv_sec};
    each_entry(fd, count_template, &tally);
    close(fd);
    return tally.count < MAX_TEMPLATES;
}

/// Builds the template `name` in the host's folder: under a name of its own first, then renamed into place, so
/// that a template is either whole or absent (a worker that finds another's renamed first removes its own).
static int build_template(int folder, const char *name) {
    if (!room_for_template(folder)) return ENOSPC;
    char building[32];
    if (random_name(building, ".building.") != 0) return EAGAIN;
    long mask_before = syscall(SYS_umask, 022);  // 0755 folders, 0644 files, whatever the host's umask
    int error = syscall(SYS_mkdirat, folder, building, 0755) == 0 ? 0 : errno;
    int dir = error ? -1 : (int)syscall(SYS_openat, folder, building, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (error == 0 && dir < 0) error = errno;
    if (error == 0) error = make_in_template(dir, "/tmp", NULL);
    if (error == 0) error = make_in_template(dir, "/proc", NULL);
    for (size_t i = 0; i < grant_count && error == 0; i++)
        if (grants[i].templated) error = make_in_template(dir, grants[i].path, &grants[i]);
    if (dir >= 0) close(dir);
    syscall(SYS_umask, mask_before);
    if (error == 0 && syscall(SYS_renameat2, folder, building, folder, name, RENAME_NOREPLACE) != 0
        && errno != EEXIST && errno != ENOTEMPTY)
        error = errno;
    walk_built(folder, building, 0, WALK_REMOVE);  // gone already when the rename took it
    return error;
}

/// A read-only clone of the template `name`, checked to be the folder the launcher's descriptor holds; *touched gets
/// the template's last change of times.
static int clone_template(const struct profile *p, const char *name, time_t *touched) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", p->root_templates, name);
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC};
    int fd = clone_restricted(path, &attr);
    if (fd < 0) return -1;
    struct stat clone, expected;
    if (fstat(fd, &clone) != 0 || syscall(SYS_newfstatat, p->root_templates_fd, name, &expected, AT_SYMLINK_NOFOLLOW) != 0
        || clone.st_dev != expected.st_dev || clone.st_ino != expected.st_ino || !S_ISDIR(clone.st_mode)) {
        close(fd);
        errno = EXDEV;
        return -1;
    }
    *touched = expected.st_mtime;
    return fd;
}

/// Whether the clone `fd` holds every mount point these grants need, each what it must be (a folder, an empty
/// file, a link), and /tmp and /proc: a template damaged since it was built (a temp-folder cleaner's work, say)
/// would otherwise fail the launch halfway.
static int template_whole(int fd) {
    struct stat info;
    if (syscall(SYS_newfstatat, fd, "tmp", &info, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(info.st_mode)) return 0;
    if (syscall(SYS_newfstatat, fd, "proc", &info, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(info.st_mode)) return 0;
    for (size_t i = 0; i < grant_count; i++) {
        const struct grant *g = &grants[i];
        if (!g->templated) continue;
        if (syscall(SYS_newfstatat, fd, g->path + 1, &info, AT_SYMLINK_NOFOLLOW) != 0) return 0;
        if (g->link[0] ? !S_ISLNK(info.st_mode)
            : g->directory ? !S_ISDIR(info.st_mode) : !(S_ISREG(info.st_mode) && info.st_size == 0))
            return 0;
    }
    return 1;
}

/// A clone of the template of these grants, whole: found, or built (once more after one found damaged, which is
/// set aside); -1 where there is none.
static int whole_template(const struct profile *p, const char *name) {
    int folder = p->root_templates_fd;
    for (int attempt = 0; attempt < 2; attempt++) {
        time_t touched = 0;
        int fd = clone_template(p, name, &touched);
        if (fd < 0 && errno == ENOENT && build_template(folder, name) == 0) fd = clone_template(p, name, &touched);
        if (fd < 0) return -1;
        if (template_whole(fd)) {
            // Times set to now once a day, so that a cleaner of old temporary files (systemd-tmpfiles ages /tmp)
            // does not take a template in use apart.
            struct timespec now;
            syscall(SYS_clock_gettime, CLOCK_REALTIME, &now);
            if (touched < now.tv_sec - 86400) walk_built(folder, name, 0, WALK_TOUCH);
            return fd;
        }
        // Set aside (kept: workers cloned from it before it was damaged may still run on it) unless another
        // launcher has put a whole one in its place meanwhile.
        struct stat clone, now_there;
        int same = fstat(fd, &clone) == 0 && syscall(SYS_newfstatat, folder, name, &now_there, AT_SYMLINK_NOFOLLOW) == 0
            && clone.st_dev == now_there.st_dev && clone.st_ino == now_there.st_ino;
        close(fd);
        char aside[32];
        if (same && (random_name(aside, ".damaged.") != 0
                     || syscall(SYS_renameat2, folder, name, folder, aside, RENAME_NOREPLACE) != 0))
            return -1;
    }
    return -1;
}

/// Finds (or builds) the template of these grants and clones it; where anything fails the root is a tmpfs,
/// with every mount point made as it goes.
static void use_template(const struct profile *p) {
    template_fd = -1;
    int usable = p->root_templates_fd >= 0 && choose_templated();
    if (usable) {
        char name[65];
        template_name(name);
        template_fd = whole_template(p, name);
    }
    if (template_fd < 0)
        for (size_t i = 0; i < grant_count; i++) grants[i].templated = 0;
}

int collect_grants(const struct profile *p, char *skipped, size_t skipped_size, const char **why) {
    grant_count = 0;
    if (!add_grant(p->executable, GRANT_EXECUTABLE, skipped, skipped_size)) {
        static char text[3200];
        int error = errno ? errno : ENOENT;
        snprintf(text, sizeof text, "cannot open the executable %s", p->executable);
        return fail(why, text, error);
    }
    for (size_t i = 0; i < p->runtime.count; i++) add_grant(p->runtime.items[i], GRANT_RUNTIME, skipped, skipped_size);
    for (size_t i = 0; i < p->readable.count; i++) add_grant(p->readable.items[i], GRANT_READ, skipped, skipped_size);
    // The host's folder for a bestEffort worker is its TMPDIR only where it gets no root: in a root, TMPDIR is the
    // root's own tmpfs, and the folder (named for this worker alone) is not bound.
    for (size_t i = 0; i < p->writable.count; i++)
        if (!p->worker_folder || strcmp(p->writable.items[i], p->worker_folder) != 0)
            add_grant(p->writable.items[i], GRANT_WRITE, skipped, skipped_size);
    // The host's folder of the four nodes (a root host makes one) is one bind instead of four, unless another
    // grant lies under /dev: its mount point could not be made in that read-only folder.
    static const char *devices[] = {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"};
    int under_dev = 0;
    const struct paths *lists[] = {&p->runtime, &p->readable, &p->writable};
    for (size_t l = 0; l < 3; l++)
        for (size_t i = 0; i < lists[l]->count; i++)
            if (strncmp(lists[l]->items[i], "/dev/", 5) == 0 || strcmp(lists[l]->items[i], "/dev") == 0) under_dev = 1;
    if (!p->device_folder || under_dev || !add_grant_from(p->device_folder, "/dev", GRANT_DEVICES, skipped, skipped_size))
        for (size_t i = 0; i < 4; i++) add_grant(devices[i], GRANT_DEVICE, skipped, skipped_size);
    for (size_t i = 0; i < p->masked.count; i++) {
        // A restriction fails closed: a mask that does not fit is a launch that does not happen.
        if (grant_count >= MAX_GRANTS) return fail(why, "too many grants and masked folders for the new root", E2BIG);
        if (!clean_path(p->masked.items[i])) return fail(why, "a masked folder is not a clean absolute path", EINVAL);
        struct grant *g = &grants[grant_count++];
        memset(g, 0, sizeof *g);
        g->path = g->source = p->masked.items[i];
        g->kind = GRANT_MASK;
        g->fd = -1;
        g->directory = 1;
    }
    // Parents before what is inside them: a grant inside another is bound on top of it.
    for (size_t i = 1; i < grant_count; i++) {
        struct grant g = grants[i];
        size_t j = i;
        for (; j > 0 && compare_paths(&grants[j - 1], &g) > 0; j--) grants[j] = grants[j - 1];
        grants[j] = g;
    }
    use_template(p);
    return 0;
}

/// Whether the new root was mounted over /tmp, whether the worker entered it, and whether pivot_root has made it the
/// root: before that, a failed root is taken down again (and only what was mounted for it: /tmp may be the
/// machine's own mount).
static int mounted, entered, pivoted;

static int build_root_in(const struct profile *p, const char **why);

int build_root(const struct profile *p, const char **why) {
    mounted = entered = pivoted = 0;
    int error = build_root_in(p, why);
    // A bestEffort worker goes on without a root of its own: what was mounted over /tmp for it goes, or its /tmp
    // (and its TMPDIR there, the host's folder for it) would be the half-built root's.
    if (error && mounted && !pivoted) {
        syscall(SYS_umount2, ROOT, MNT_DETACH);
        if (entered) syscall(SYS_chdir, "/");
    }
    return error;
}

static int build_root_in(const struct profile *p, const char **why) {
    // Nothing mounted here propagates back to the host's mount namespace.
    if (syscall(SYS_mount, NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        return fail(why, "cannot make the mount namespace private", errno);

    int templated = template_fd >= 0;
    if (templated) {
        // Read-only already: the clone was made so.
        int error = syscall(SYS_move_mount, template_fd, "", AT_FDCWD, ROOT, MOVE_MOUNT_F_EMPTY_PATH) == 0 ? 0 : errno;
        close(template_fd);
        template_fd = -1;
        if (error) return fail(why, "cannot attach the new root's template (move_mount)", error);
    } else if (syscall(SYS_mount, "sdk-host-root", ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=4096") != 0) {
        return fail(why, "cannot mount the new root's tmpfs", errno);
    }
    mounted = 1;
    // TMPDIR first: a grant under /tmp (an executable in a temporary folder, say) is bound inside it, on top.
    char options[96];
    snprintf(options, sizeof options, "mode=0700,size=%lldm,uid=%u,gid=%u", p->temp_mb > 0 ? p->temp_mb : 64,
             p->mapped_uid, p->mapped_gid);
    if (!templated && syscall(SYS_mkdirat, AT_FDCWD, ROOT "/tmp", 0755) != 0 && errno != EEXIST)
        return fail(why, "cannot make /tmp in the new root", errno);
    remember_made(ROOT, strlen(ROOT));
    if (syscall(SYS_mount, "sdk-host-tmp", ROOT "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options) != 0)
        return fail(why, "cannot mount the worker's TMPDIR", errno);

    int error = 0;
    for (size_t i = 0; i < grant_count && error == 0; i++) error = bind(&grants[i], why);
    for (size_t i = 0; i < grant_count; i++)
        if (grants[i].fd >= 0) close(grants[i].fd);
    if (error) return error;
    for (size_t i = 0; i < grant_count; i++) {
        if (grants[i].kind != GRANT_MASK || grants[i].absent) continue;
        static char target[4096];
        snprintf(target, sizeof target, ROOT "%s", grants[i].path);
        if (syscall(SYS_mount, NULL, target, NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
            return fail(why, "cannot make a masked folder read-only", errno);
    }
    if (!templated && syscall(SYS_mkdirat, AT_FDCWD, ROOT "/proc", 0555) != 0 && errno != EEXIST)
        return fail(why, "cannot make /proc in the new root", errno);
    if (syscall(SYS_mount, "proc", ROOT "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        return fail(why, "cannot mount the worker's own /proc", errno);
    // pivot_root(".", ".") stacks the old root under the new one; detaching it leaves only the new root.
    if (syscall(SYS_chdir, ROOT) != 0) return fail(why, "cannot enter the new root", errno);
    entered = 1;
    if (syscall(SYS_pivot_root, ".", ".") != 0) return fail(why, "pivot_root refused", errno);
    pivoted = 1;
    if (syscall(SYS_umount2, ".", MNT_DETACH) != 0) return fail(why, "cannot detach the old root", errno);
    if (syscall(SYS_chdir, "/") != 0) return fail(why, "cannot enter the new root", errno);
    if (!templated && syscall(SYS_mount, NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) != 0)
        return fail(why, "cannot make the new root read-only", errno);
    return 0;
}
