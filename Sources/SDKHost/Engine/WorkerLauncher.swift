// WorkerLauncher: the seam between the engine and process creation. The engine asks a launcher for a worker
// and gets back a child it can signal, watch and reap, plus the worker's socket and output pipes. The real
// launcher is posix_spawn with a pidfd; tests substitute launchers whose spawn fails, whose reap fails (as when
// the app ignores SIGCHLD) or whose exit descriptor cannot be watched, and the simulation substitutes workers
// that live in the test process. The engine handles each of those paths the same way for every launcher.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix

/// A launched worker process as the engine sees it. Loop-confined once handed to the engine.
package protocol WorkerChild: AnyObject {
    /// The process id (for logs, `pid(for:)` and crash reports).
    var pid: pid_t { get }
    /// A descriptor that becomes readable when the process has exited (a pidfd for real processes).
    var exitDescriptor: Int32 { get }
    /// Sends a signal; one that has already exited is not an error.
    func signal(_ signal: Int32)
    /// Reaps without blocking: the status, nil if it has not exited, or an error when the status is gone.
    func reap() throws(SystemError) -> ExitStatus?
    /// Releases the exit descriptor. Called once, after the engine stopped watching it.
    func close()
    /// What the scheduler has given the process `pid` (the worker's own, which is not the host's child when a
    /// launcher stays as its supervisor), or nil where that cannot be read.
    func schedulerTimes(of pid: pid_t) -> SchedulerTimes?
}

extension WorkerChild {
    /// A real process's, from /proc.
    package func schedulerTimes(of pid: pid_t) -> SchedulerTimes? { SchedulerTimes(readingProcess: pid) }
}

/// What the scheduler has given a process: whether any of its threads is runnable now (waiting for a CPU or on
/// one), and its threads' time on a CPU and waiting for one, in all (`/proc/<pid>/task/*/schedstat`).
package struct SchedulerTimes: Equatable, Sendable {
    package var runnable: Bool
    package var ranNanoseconds: UInt64
    package var waitedNanoseconds: UInt64

    package init(runnable: Bool, ranNanoseconds: UInt64, waitedNanoseconds: UInt64) {
        self.runnable = runnable
        self.ranNanoseconds = ranNanoseconds
        self.waitedNanoseconds = waitedNanoseconds
    }

    /// Read from /proc, or nil.
    init?(readingProcess pid: pid_t) {
        guard let tids = listDirectory("/proc/\(pid)/task"), !tids.isEmpty else { return nil }
        var times = SchedulerTimes(runnable: false, ranNanoseconds: 0, waitedNanoseconds: 0)
        for tid in tids {
            let thread = ThreadSchedule(pid: pid, tid: tid)
            if thread.state == "R" { times.runnable = true }
            times.ranNanoseconds &+= thread.ran ?? 0
            times.waitedNanoseconds &+= thread.waited ?? 0
        }
        self = times
    }
}

/// When a silent worker was first seen runnable, and the CPU time it had then.
struct StarvationCheck: Equatable {
    var at: UInt64
    var ran: UInt64
}

/// One thread's state letter and schedstat, from /proc.
struct ThreadSchedule {
    var state = "?"
    /// Nanoseconds on a CPU, and runnable waiting for one.
    var ran: UInt64?
    var waited: UInt64?

    init(pid: pid_t, tid: String) {
        let stat = (try? readFile("/proc/\(pid)/task/\(tid)/stat")).map { String(decoding: $0, as: UTF8.self) } ?? ""
        // The state follows the command's closing parenthesis (a command may hold spaces and parentheses).
        state = stat.lastIndex(of: ")").flatMap { stat[stat.index(after: $0)...].split(separator: " ").first }.map(String.init) ?? "?"
        let sched = (try? readFile("/proc/\(pid)/task/\(tid)/schedstat")).map { String(decoding: $0, as: UTF8.self) } ?? ""
        let fields = sched.split(separator: " ").prefix(2).compactMap { UInt64($0.filter(\.isNumber)) }
        if fields.count == 2 { (ran, waited) = (fields[0], fields[1]) }
    }
}

/// What a launcher returns: the child and the host's ends of its channels.
package struct LaunchedWorker: ~Copyable {
    package var child: any WorkerChild
    // Optional so that the engine can take each one out (Swift cannot move single fields out of the struct).
    package var socket: FileDescriptor?
    package var stdout: FileDescriptor?
    package var stderr: FileDescriptor?
    /// The page the worker registers its exit notice in (ExitNotice.swift), if it was given one.
    package var exitNotice: ExitNoticePage?

    package init(child: any WorkerChild, socket: consuming FileDescriptor, stdout: consuming FileDescriptor,
                 stderr: consuming FileDescriptor, exitNotice: ExitNoticePage? = nil)
    {
        self.child = child
        self.exitNotice = exitNotice
        self.socket = .some(consume socket)
        self.stdout = .some(consume stdout)
        self.stderr = .some(consume stderr)
    }
}

/// Makes and removes workers' private temp folders: in the file system, or (the simulation) in memory.
package protocol WorkerFolders: Sendable {
    /// A new private folder in `base`.
    func make(in base: String) throws(HostError) -> String
    /// Removes `folder` and what the worker left in it; whether it is gone.
    @discardableResult
    func remove(_ folder: String) -> Bool
}

/// Workers' folders in the file system: `sdk-host-worker.<host pid>.XXXXXX`, mode 0700, removed whole.
package struct FileSystemFolders: WorkerFolders {
    package init() {}
    package func make(in base: String) throws(HostError) -> String { try SandboxProfile.makeWorkerDirectory(in: base) }
    @discardableResult
    package func remove(_ folder: String) -> Bool { removeTree(folder) }
}

/// Creates worker processes.
package protocol WorkerLauncher: Sendable {
    func launch(_ request: SpawnRequest) throws(SystemError) -> LaunchedWorker
}

/// The real launcher: posix_spawn, a socketpair on fd 3, stdout and stderr pipes, a pidfd, and the exit-notice
/// page on fd 5 when the request asks for one.
package struct PosixLauncher: WorkerLauncher {
    package init() {}

    package func launch(_ request: SpawnRequest) throws(SystemError) -> LaunchedWorker {
        let channels = try spawnWithChannels(request)
        let notice = channels.exitNotice
        let child = PidfdChild(channels.process)
        return LaunchedWorker(child: child, socket: channels.socket, stdout: channels.stdout, stderr: channels.stderr,
                              exitNotice: notice)
    }
}

/// A real child process, watched and reaped through its pidfd.
package final class PidfdChild: WorkerChild {
    private var process: SpawnedProcess?
    package let pid: pid_t
    package let exitDescriptor: Int32

    package init(_ process: consuming SpawnedProcess) {
        pid = process.pid
        exitDescriptor = process.pidfd.rawValue
        self.process = consume process
    }

    package func signal(_ signal: Int32) {
        guard let process = process.take() else { return }
        process.signal(signal)
        self.process = consume process
    }

    package func reap() throws(SystemError) -> ExitStatus? {
        guard let process = process.take() else { return nil }
        let result = Result { () throws(SystemError) in try process.reap() }
        self.process = consume process
        return try result.get()
    }

    package func close() { process.take()?.close() }

    deinit { process.take()?.close() }
}
