// The confinement layers the launcher applies, each a function that returns 0 or an errno value and, on
// failure, a reason in `why` (a static or caller-provided string).
#ifndef SDK_LAUNCHER_SANDBOX_H
#define SDK_LAUNCHER_SANDBOX_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct paths {
    char **items;
    size_t count;
};

struct profile {
    const char *extension;   // the extension's identifier, for messages
    const char *executable;  // what the launcher execs
    char **argv;
    char **envp;
    long long host_pid;       // the launcher's parent must be this process
    int mode;                 // SANDBOX_STRICT, SANDBOX_BEST_EFFORT, SANDBOX_NONE
    int network;              // NetworkAllowed
    int subprocesses;         // AllowSubprocesses
    long long memory_mb;      // MemoryLimitMB (0: none)
    long long descriptors;    // RLIMIT_NOFILE (0: leave)
    struct paths executable_paths;  // read + execute (Landlock): the executable and the runtime folders
    struct paths runtime;           // the operator's runtime folders: bound read-only into the new root
    struct paths readable;          // ReadablePaths and what the runtime must read
    struct paths writable;          // WritablePaths and the private temp folder
    struct paths masked;            // MaskedPaths: folders of the runtime hidden under an empty read-only tmpfs
    unsigned mapped_uid;      // the worker's uid and gid (WorkerUser's for a root launcher; the same inside its
                              // user namespace as outside)
    unsigned mapped_gid;
    long long temp_mb;        // TempSizeMB: the worker's TMPDIR tmpfs
    long long max_threads;    // MaxThreads: RLIMIT_NPROC inside the worker's own user namespace
    int root_built;           // the worker runs on its own root, whose /tmp is its TMPDIR
    const char *executable_sha256;  // ExecutableSHA256 (64 lowercase hex digits), or NULL
    int shared_network;       // joined the host's one empty network namespace (descriptor 6): make none
    const char *device_folder;  // a folder of the host's holding the four device nodes, bound as /dev, or NULL
    const char *worker_folder;  // WorkerFolder: the host's folder for this worker (in WritablePaths), its TMPDIR
                                // where it gets no root of its own; not bound into one
    const char *root_templates; // RootTemplates: a folder of the host's where roots' mount points are kept, or NULL
    int root_templates_fd;      // that folder, opened by the launcher once it checked whose it is, or -1
};

enum { SANDBOX_STRICT, SANDBOX_BEST_EFFORT, SANDBOX_NONE };

void mark(const char *step);
/// The launcher's runtime (runtime.c): a system call that returns -errno and writes no `errno`; and clone(2) onto
/// `stack_top`, where the child runs `entry(arg)`, which must never return (it execs or exits).
long raw_syscall(long n, long a, long b, long c, long d, long e, long f);
pid_t clone_onto(unsigned long flags, void *stack_top, int *parent_tid, void (*entry)(void *), void *arg);
/// The SHA-256 of what `fd` reads to its end, as 64 lowercase hex digits. Returns 0 or an errno.
int sha256_descriptor(int fd, char hex[65]);
/// The same, of bytes added piece by piece.
struct sha256 { uint32_t state[8]; uint64_t total; uint8_t block[64]; size_t held; };
void sha256_start(struct sha256 *h);
void sha256_add(struct sha256 *h, const void *bytes, size_t n);
void sha256_finish(struct sha256 *h, char hex[65]);
/// The Landlock ABI version, or a negative errno.
int landlock_abi(void);
/// Restricts the calling thread to the profile's paths (and TCP and scoping when the ABI has them).
/// *abi gets the ABI used; skipped paths (missing, unopenable) are appended to `skipped` as text.
int apply_landlock(const struct profile *p, int *abi, char *skipped, size_t skipped_size, const char **why);
/// Installs the seccomp filter for a worker whose pid is `self`. Returns 0 or an errno.
int apply_seccomp(const struct profile *p, pid_t self, const char **why);
/// Appends "path (reason)" to a comma-separated list of what was skipped.
void note_skipped(char *skipped, size_t size, const char *path, int error);
/// New user, pid, mount, IPC, UTS and (without NetworkAllowed) network namespaces around a new pid 1 (*init),
/// with one-to-one uid and gid maps of the worker's ids; the caller joins them all, so that its next child is
/// made in them. `alive` is the read end of a pipe the launcher holds open while it lives. Returns 0 or an errno.
int make_namespaces(const struct profile *p, int alive, pid_t *init, const char **why);
/// In the launcher, before any namespace: opens RootTemplates if it is the host's own folder (else none is used).
void open_root_templates(struct profile *p);
/// In the worker (pid 2 of its namespace), before it takes its uid: opens each grant's source, and finds or
/// builds the root's template.
int collect_grants(const struct profile *p, char *skipped, size_t skipped_size, const char **why);
/// Then, as the worker's uid: builds its root from the grants and pivots into it.
int build_root(const struct profile *p, const char **why);
/// Takes the worker's uid and gid (a root host's WorkerUser). Call after collect_grants, before build_root.
int become_worker_user(const struct profile *p, const char **why);
/// Empties the effective, permitted, inheritable and ambient sets and, as root, locks the securebits that
/// would let an exec or a uid change restore them. Call after no_new_privs.
int drop_capabilities(const char **why);

#endif
