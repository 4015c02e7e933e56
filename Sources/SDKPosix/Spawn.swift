// Spawning workers with posix_spawn (no Swift code runs between fork and exec) and reaping them through a
// pidfd. Why pidfd rather than a SIGCHLD self-pipe: a library must not install a process-wide SIGCHLD handler
// in someone else's app, a pidfd is one more descriptor in the same epoll set, and it names exactly one process,
// so a recycled pid can never be signalled or reaped by mistake.

#if canImport(Glibc)
import Glibc
#endif
import CSDKShim

/// What the child gets: the executable, its arguments and environment, and its three pipes/sockets.
public struct SpawnRequest {
    /// Absolute path of the executable.
    public var path: String
    /// argv, including argv[0].
    public var arguments: [String]
    /// The complete environment, as "KEY=value".
    public var environment: [String]
    /// Bytes the child reads from descriptor 4 until end-of-file (the sandbox launcher's profile), or nil.
    /// At most `maxProfileBytes`, so that writing them into a pipe before the spawn never blocks.
    public var profile: [UInt8]?
    /// Whether the child gets an exit-notice page on descriptor 5 (`ExitNoticePage`).
    public var exitNotice = false
    /// A descriptor the child gets as 6 (the shared network namespace the sandbox launcher joins), or -1. It
    /// stays the caller's; it must be 10 or above.
    public var networkNamespace: Int32 = -1

    /// The largest `profile`: what a pipe holds without a reader.
    public static let maxProfileBytes = 60 * 1024

    /// Creates a request.
    public init(path: String, arguments: [String], environment: [String], profile: [UInt8]? = nil) {
        self.path = path
        self.arguments = arguments
        self.environment = environment
        self.profile = profile
    }
}

/// A spawned child: its pid and a pidfd that becomes readable when it exits.
@frozen
public struct SpawnedProcess: ~Copyable {
    /// The child's pid.
    public let pid: pid_t
    /// Readable once the child has exited; reap with `reap()`.
    public var pidfd: FileDescriptor

    init(pid: pid_t, pidfd: consuming FileDescriptor) {
        self.pid = pid
        self.pidfd = pidfd
    }
}

/// How a process ended.
public enum ExitStatus: Equatable, Sendable, CustomStringConvertible {
    /// It called exit with this status.
    case exited(Int32)
    /// A signal ended it.
    case signaled(Int32)

    /// Decodes a wait status.
    public init(waitStatus s: Int32) {
        if s & 0x7F == 0 {
            self = .exited((s >> 8) & 0xFF)
        } else {
            self = .signaled(s & 0x7F)
        }
    }

    public var description: String {
        switch self {
        case .exited(let code): "exit status \(code)"
        case .signaled(let sig): "signal \(sig) (\(signalName(sig)))"
        }
    }
}

/// "SIGSEGV" for 11, and so on; "SIG<n>" for the rest.
public func signalName(_ sig: Int32) -> String {
    switch sig {
    case SIGHUP: "SIGHUP"
    case SIGINT: "SIGINT"
    case SIGQUIT: "SIGQUIT"
    case SIGILL: "SIGILL"
    case SIGTRAP: "SIGTRAP"
    case SIGABRT: "SIGABRT"
    case SIGBUS: "SIGBUS"
    case SIGFPE: "SIGFPE"
    case SIGKILL: "SIGKILL"
    case SIGSEGV: "SIGSEGV"
    case SIGPIPE: "SIGPIPE"
    case SIGALRM: "SIGALRM"
    case SIGTERM: "SIGTERM"
    case SIGUSR1: "SIGUSR1"
    case SIGUSR2: "SIGUSR2"
    case SIGSTOP: "SIGSTOP"
    case SIGXCPU: "SIGXCPU"
    case SIGXFSZ: "SIGXFSZ"
    case SIGSYS: "SIGSYS"
    default: "SIG\(sig)"
    }
}

/// A spawned worker and the host's ends of its channels: the IPC socket and the read ends of its stdout and
/// stderr pipes, all close-on-exec and non-blocking.
@frozen
public struct WorkerChannels: ~Copyable {
    /// The process and its pidfd.
    public var process: SpawnedProcess
    /// The host's end of the socket pair; the child has the other end on fd 3.
    public var socket: FileDescriptor
    /// Read end of the child's stdout.
    public var stdout: FileDescriptor
    /// Read end of the child's stderr.
    public var stderr: FileDescriptor
    /// The exit-notice page the child got on descriptor 5, if the request asked for one.
    public var exitNotice: ExitNoticePage?

    /// Closes all four descriptors. Reap the process first: its pidfd is one of them.
    public consuming func close() {
        process.close()
        socket.close()
        stdout.close()
        stderr.close()
    }

    /// Sends `signal`, waits (sleeping, so for tools and tests, never an event loop) until the child is reaped,
    /// then closes everything. Returns how it ended.
    @discardableResult
    public consuming func terminate(signal: Int32) -> ExitStatus? {
        process.signal(signal)
        var status: ExitStatus?
        while status == nil {
            do {
                status = try process.reap()
            } catch {
                break
            }
            if status == nil { usleep(1000) }
        }
        close()
        return status
    }
}

/// Creates a socket pair and two pipes, spawns `request` with the child's ends on fds 3, 1 and 2 (and
/// /dev/null on 0), closes the child's ends in the parent, and returns the rest. On any failure every
/// descriptor it opened is closed and no process is left behind.
public func spawnWithChannels(_ request: SpawnRequest) throws(SystemError) -> WorkerChannels {
    var opened: [Int32] = []
    func closeAll() { for fd in opened { _ = Glibc.close(fd) } }
    do throws(SystemError) {
        var sv: [Int32] = [-1, -1], out: [Int32] = [-1, -1], err: [Int32] = [-1, -1]
        try retryingEINTR("socketpair") {
            socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &sv)
        }
        opened += sv
        try retryingEINTR("pipe2") { sdk_pipe_cloexec(&out) }
        opened += out
        try retryingEINTR("pipe2") { sdk_pipe_cloexec(&err) }
        opened += err
        // The child's ends must not sit on 0...5, or dup2 onto them would alias its own source.
        func raised(_ fd: Int32) throws(SystemError) -> Int32 {
            if fd > 5 { return fd }
            let copy = try retryingEINTR("fcntl(F_DUPFD_CLOEXEC)") { fcntl(fd, F_DUPFD_CLOEXEC, 6) }
            opened.append(copy)
            return copy
        }
        let childSocket = try raised(sv[1]), childOut = try raised(out[1]), childErr = try raised(err[1])
        try setNonBlocking(sv[0])
        try setNonBlocking(out[0])
        try setNonBlocking(err[0])
        var profileFD: Int32 = -1
        if let profile = request.profile {
            guard profile.count <= SpawnRequest.maxProfileBytes else {
                throw SystemError("spawn", errno: E2BIG, detail: "profile of \(profile.count) bytes is over "
                    + "\(SpawnRequest.maxProfileBytes)")
            }
            var pipe: [Int32] = [-1, -1]
            try retryingEINTR("pipe2") { sdk_pipe_cloexec(&pipe) }
            opened += pipe
            try profile.withUnsafeBytes { bytes in
                Result { () throws(SystemError) in try writeAll(pipe[1], bytes, detail: "sandbox profile") }
            }.get()
            _ = Glibc.close(pipe[1])
            opened.removeAll { $0 == pipe[1] }
            profileFD = try raised(pipe[0])
        }
        var notice: ExitNoticePage?
        var noticeFD: Int32 = -1
        if request.exitNotice {
            let (page, fd) = try ExitNoticePage.create()
            notice = page
            opened.append(fd)
            noticeFD = try raised(fd)
        }
        let process = try spawnRaw(request, ipc: childSocket, stdout: childOut, stderr: childErr, profile: profileFD,
                                   notice: noticeFD)
        let hostEnds: Set<Int32> = [sv[0], out[0], err[0]]
        for fd in opened where !hostEnds.contains(fd) { _ = Glibc.close(fd) }
        notice?.owner = process.pid
        notice?.ownID = process.pid
        return WorkerChannels(
            process: process, socket: FileDescriptor(adopting: sv[0]), stdout: FileDescriptor(adopting: out[0]),
            stderr: FileDescriptor(adopting: err[0]), exitNotice: notice)
    } catch {
        closeAll()
        throw error
    }
}

func spawnRaw(_ request: SpawnRequest, ipc: Int32, stdout: Int32, stderr: Int32, profile: Int32 = -1, notice: Int32 = -1)
    throws(SystemError) -> SpawnedProcess
{
    precondition(ipc > 5 && stdout > 5 && stderr > 5 && (profile == -1 || profile > 5) && (notice == -1 || notice > 5),
                 "spawn sources must be above 5")
    let argv = CStringArray(request.arguments)
    let envp = CStringArray(request.environment)
    defer {
        argv.free()
        envp.free()
    }
    var pid: pid_t = 0
    precondition(request.networkNamespace == -1 || request.networkNamespace >= 10, "the namespace's descriptor must be >= 10")
    let rc = sdk_spawn(request.path, argv.pointers, envp.pointers, ipc, stdout, stderr, profile, notice,
                       request.networkNamespace, &pid)
    guard rc == 0 else { throw SystemError("posix_spawn", errno: rc, detail: request.path) }
    let pidfd = sdk_pidfd_open(pid)
    guard pidfd >= 0 else {
        let e = errno
        // Without a pidfd we cannot supervise it: kill and reap now so nothing is left behind.
        kill(pid, SIGKILL)
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        throw SystemError("pidfd_open", errno: e, detail: "pid \(pid)")
    }
    return SpawnedProcess(pid: pid, pidfd: FileDescriptor(adopting: pidfd))
}

/// A pidfd of `pid`, a process this one did not spawn (a launcher's child, say), or nil if it has ended.
public func openPidfd(_ pid: pid_t) -> FileDescriptor? {
    let fd = sdk_pidfd_open(pid)
    return fd >= 0 ? FileDescriptor(adopting: fd) : nil
}

/// Sends `signal` through `pidfd`; a process that has already exited is not an error.
public func signalThroughPidfd(_ pidfd: Int32, _ signal: Int32) {
    if sdk_pidfd_send_signal(pidfd, signal) == -1 {
        let e = errno
        checkBadDescriptor(e, "pidfd_send_signal")
    }
}

extension SpawnedProcess {
    /// Sends `signal` through the pidfd; a process that has already exited is not an error.
    public func signal(_ signal: Int32) { signalThroughPidfd(pidfd.rawValue, signal) }

    /// Reaps the child without blocking, through its pidfd (`waitid(P_PIDFD)`), so a recycled pid is never
    /// reaped. Returns nil if it has not exited yet.
    ///
    /// - Throws: `SystemError` with ECHILD when the status is gone: the app ignores SIGCHLD (the kernel reaped
    ///   the child itself) or reaped it with `wait()`.
    public func reap() throws(SystemError) -> ExitStatus? {
        var status: Int32 = 0
        let r = try retryingEINTR("waitid(P_PIDFD)", detail: "pid \(pid)") { sdk_waitid_pidfd(pidfd.rawValue, &status) }
        return r == 0 ? nil : ExitStatus(waitStatus: status)
    }

    /// Closes the pidfd. Call after `reap()` returned a status.
    public consuming func close() {
        pidfd.close()
    }
}

/// A NULL-terminated array of C strings, freed explicitly.
struct CStringArray {
    let pointers: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>

    init(_ strings: [String]) {
        pointers = .allocate(capacity: strings.count + 1)
        for (i, s) in strings.enumerated() { pointers[i] = strdup(s) }
        pointers[strings.count] = nil
    }

    func free() {
        var i = 0
        while let p = pointers[i] {
            Glibc.free(p)
            i += 1
        }
        pointers.deallocate()
    }
}

/// Sets the signal the kernel sends this process when its parent thread exits (worker side).
public func setParentDeathSignal(_ signal: Int32) throws(SystemError) {
    try retryingEINTR("prctl(PR_SET_PDEATHSIG)") { sdk_set_parent_death_signal(signal) }
}
