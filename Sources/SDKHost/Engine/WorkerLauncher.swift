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
    /// From now on signals go to `pid`, the launcher's child, rather than to the launcher: where the worker has no
    /// pid namespace of its own, the launcher is a subreaper that kills what the worker leaves when it ends, and
    /// killed first it could not. `pid` is held (a pidfd) before `isChild` is asked whether it is the launcher's
    /// child, so that a pid reused in between is never taken. False if it cannot be held or is not the child.
    func signalWorker(_ pid: pid_t, ifChild isChild: () -> Bool) -> Bool
}

extension WorkerChild {
    /// A real process's, from /proc.
    package func schedulerTimes(of pid: pid_t) -> SchedulerTimes? { SchedulerTimes(readingProcess: pid) }
    /// Signals go to the host's child (a fake worker is its own process).
    package func signalWorker(_ pid: pid_t, ifChild isChild: () -> Bool) -> Bool { false }
}

/// What the scheduler has given a process: whether any of its threads is runnable now (waiting for a CPU or on
/// one), whether one of those runs at a priority it lowered itself, its CPU time in all (threads that have exited
/// included), and its live threads' time waiting for a CPU.
package struct SchedulerTimes: Equatable, Sendable {
    package var runnable: Bool
    /// A runnable thread is SCHED_BATCH or SCHED_IDLE, or nice above 0: its wait for a CPU is its own doing.
    package var lowPriority: Bool
    package var ranNanoseconds: UInt64
    package var waitedNanoseconds: UInt64

    package init(runnable: Bool, lowPriority: Bool = false, ranNanoseconds: UInt64, waitedNanoseconds: UInt64) {
        self.runnable = runnable
        self.lowPriority = lowPriority
        self.ranNanoseconds = ranNanoseconds
        self.waitedNanoseconds = waitedNanoseconds
    }

    /// The most threads read (each is three reads on the loop thread); a process with more cannot be judged.
    static let maxThreads = 128

    /// Read from /proc, or nil (gone, unreadable, or more than `maxThreads` threads).
    init?(readingProcess pid: pid_t) {
        guard let tids = listDirectory("/proc/\(pid)/task"), !tids.isEmpty, tids.count <= Self.maxThreads,
            let process = try? readFile("/proc/\(pid)/stat"), let fields = statFields(process),
            let utime = statField(fields, 14).flatMap({ UInt64($0) }), let stime = statField(fields, 15).flatMap({ UInt64($0) })
        else { return nil }
        // From the process's own stat, which counts its exited threads too: a sum over the threads alive now could
        // go down between two looks.
        let tick = UInt64(max(sysconf(Int32(_SC_CLK_TCK)), 1))
        self.init(runnable: false, ranNanoseconds: (utime &+ stime) &* (1_000_000_000 / tick), waitedNanoseconds: 0)
        for tid in tids {
            let thread = ThreadSchedule(pid: pid, tid: tid)
            waitedNanoseconds &+= thread.waited ?? 0
            guard thread.state == "R" else { continue }
            runnable = true
            if thread.policy != 0 || (thread.nice ?? 1) > 0 { lowPriority = true }
        }
    }
}

/// The fields of a /proc stat line after the command: the command is in parentheses and may hold any byte
/// (a thread names itself), so they follow the last ')' of the line, read as bytes. Field N is at N - 3.
func statFields(_ line: [UInt8]) -> [ArraySlice<UInt8>]? {
    guard let close = line.lastIndex(of: UInt8(ascii: ")")) else { return nil }
    return line[(close + 1)...].split(whereSeparator: { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\n") })
}

/// Field `n` of a stat line, numbered as proc(5) numbers them (3, the state, is the first after the command),
/// from its `statFields`; nil past the end.
func statField(_ fields: [ArraySlice<UInt8>], _ n: Int) -> String? {
    n >= 3 && fields.count > n - 3 ? String(decoding: fields[n - 3], as: UTF8.self) : nil
}

/// When a silent worker was first seen runnable, its pid then (a sandboxed worker's changes once its launcher
/// names it) and the CPU time it had.
struct StarvationCheck: Equatable {
    var at: UInt64
    var pid: pid_t
    var ran: UInt64
}

/// One thread's state letter, priority and schedstat, from /proc.
struct ThreadSchedule {
    var state = "?"
    var nice: Int?
    var policy: Int?
    /// Nanoseconds on a CPU, and runnable waiting for one.
    var ran: UInt64?
    var waited: UInt64?

    init(pid: pid_t, tid: String) {
        if let stat = try? readFile("/proc/\(pid)/task/\(tid)/stat"), let fields = statFields(stat) {
            state = statField(fields, 3) ?? "?"
            nice = statField(fields, 19).flatMap { Int($0) }
            policy = statField(fields, 41).flatMap { Int($0) }
        }
        let sched = (try? readFile("/proc/\(pid)/task/\(tid)/schedstat")).map { String(decoding: $0, as: UTF8.self) } ?? ""
        let times = sched.split(separator: " ").prefix(2).compactMap { UInt64($0.filter(\.isNumber)) }
        if times.count == 2 { (ran, waited) = (times[0], times[1]) }
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

/// Whether `pid` is stopped (state T, or t under a tracer), from /proc/<pid>/stat. The host's own unreaped child:
/// its pid cannot be another's.
func processIsStopped(_ pid: pid_t) -> Bool {
    guard let bytes = try? readFile("/proc/\(pid)/stat"), let fields = statFields(bytes) else { return false }
    let state = statField(fields, 3)
    return state == "T" || state == "t"
}

/// A real child process, watched and reaped through its pidfd.
package final class PidfdChild: WorkerChild {
    private var process: SpawnedProcess?
    /// A pidfd of the launcher's child, where signals go instead (`signalWorker`), and the SIGKILLs sent it a
    /// second or more apart: how many, and when the last.
    private var worker: FileDescriptor?
    private var workerKills = (count: 0, last: UInt64(0))
    package let pid: pid_t
    package let exitDescriptor: Int32

    package init(_ process: consuming SpawnedProcess) {
        pid = process.pid
        exitDescriptor = process.pidfd.rawValue
        self.process = consume process
    }

    package func signal(_ signal: Int32) {
        guard let process = process.take() else { return }
        if let worker = worker.take() {
            // The worker itself, through a pidfd of its own: never a recycled pid. The launcher then kills what
            // the worker left and exits. One still there at a later SIGKILL, a second or more after the last (the
            // host kills again what is not reaped, every 3 s), may have been stopped, by the worker or what it left
            // (they share a uid): it is continued, to finish that job. One stopped again at the kill after that,
            // or still there at the tenth, is killed too, so that nothing can keep it from being reaped (what the
            // worker left then outlives it); one merely slow (a worker stuck in the kernel) is left to its job.
            signalThroughPidfd(worker.rawValue, signal)
            self.worker = consume worker
            let now = monotonicNanoseconds()
            if signal == SIGKILL, workerKills.count == 0 || now &- workerKills.last >= 1_000_000_000 {
                workerKills = (workerKills.count + 1, now)
                if workerKills.count >= 10 || (workerKills.count >= 3 && processIsStopped(pid)) {
                    process.signal(SIGKILL)
                } else if workerKills.count >= 2 {
                    process.signal(SIGCONT)
                }
            }
        } else {
            process.signal(signal)
        }
        self.process = consume process
    }

    package func signalWorker(_ pid: pid_t, ifChild isChild: () -> Bool) -> Bool {
        guard worker == nil, let fd = openPidfd(pid) else { return false }
        guard isChild() else {
            fd.close()
            return false
        }
        worker = consume fd
        return true
    }

    package func reap() throws(SystemError) -> ExitStatus? {
        guard let process = process.take() else { return nil }
        let result = Result { () throws(SystemError) in try process.reap() }
        self.process = consume process
        return try result.get()
    }

    package func close() {
        process.take()?.close()
        worker.take()?.close()
    }

    deinit {
        process.take()?.close()
        worker.take()?.close()
    }
}
