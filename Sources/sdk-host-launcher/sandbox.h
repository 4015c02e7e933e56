// The confinement layers the launcher applies, each a function that returns 0 or an errno value and, on
// failure, a reason in `why` (a static or caller-provided string).
#ifndef SDK_LAUNCHER_SANDBOX_H
#define SDK_LAUNCHER_SANDBOX_H

#include <stddef.h>
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
    struct paths executable_paths;  // read + execute: the executable, its loader and libraries
    struct paths readable;          // ReadablePaths and what the runtime must read
    struct paths writable;          // WritablePaths and the private temp folder
};

enum { SANDBOX_STRICT, SANDBOX_BEST_EFFORT, SANDBOX_NONE };

/// The Landlock ABI version, or a negative errno.
int landlock_abi(void);
/// Restricts the calling thread to the profile's paths (and TCP and scoping when the ABI has them).
/// *abi gets the ABI used; skipped paths (missing, unopenable) are appended to `skipped` as text.
int apply_landlock(const struct profile *p, int *abi, char *skipped, size_t skipped_size, const char **why);
/// Installs the seccomp filter for a worker whose pid is `self`. Returns 0 or an errno.
int apply_seccomp(const struct profile *p, pid_t self, const char **why);
/// Empties the effective, permitted, inheritable and ambient sets and, as root, locks the securebits that
/// would let an exec or a uid change restore them. Call after no_new_privs.
int drop_capabilities(const char **why);

#endif
