// WorkerProcess: one spawned extension process as the host sees it. Loop-confined: every property is read
// and written on the engine's event-loop thread only. It owns the worker's socket, stdout/stderr pipes and
// exit descriptor, and closes each exactly once.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix

final class WorkerProcess {
    // Stored properties `@exclusivity(unchecked)` (see RequestTable), but for `stdoutLines` and `stderrLines`,
    // whose appends call the engine's log sink inside the access, and `readyWaiters`, which holds callers'
    // closures. `lifecycle`'s one callout, its observer, counts transitions in EngineMetrics and never reaches a
    // worker.
    let extensionID: String
    let policy: ExtensionPolicy
    /// The pool it serves (see HostEngine+Supervision), and the daemon client app of that pool.
    @exclusivity(unchecked) var poolKey: String
    @exclusivity(unchecked) var app: String?
    /// Seconds this worker lives idle before it is retired, instead of the policy's `IdleTimeoutSeconds`: set
    /// when its app has no connection left (HostEngine+Capacity `appLeft`).
    @exclusivity(unchecked) var idleTimeoutOverride: Double?
    /// The pid of the process that runs the extension: the host's child, or, when the launcher stays as its
    /// supervisor (around its pid namespace, or as its subreaping parent), the launcher's child (`sandboxed` names
    /// it, and `adoptWorkerPID` checks it). Reported and read in /proc. Signals go to the host's child through its
    /// pidfd; under a subreaping launcher to the worker, through a pidfd of its own (`WorkerChild.signalWorker`).
    @exclusivity(unchecked) private(set) var pid: pid_t
    /// The host's own child: the worker, or its launcher.
    let childPID: pid_t
    let startedAt: UInt64
    /// Its phase, and what was recorded on the way (WorkerLifecycle.swift).
    @exclusivity(unchecked) var lifecycle = WorkerLifecycle()

    // Descriptors: the raw numbers stay valid until the matching `close…` call.
    let stdoutFD: Int32
    let stderrFD: Int32
    let exitFD: Int32
    private let child: any WorkerChild
    @exclusivity(unchecked) private var childOpen = true
    @exclusivity(unchecked) private var stdoutPipe: FileDescriptor?
    @exclusivity(unchecked) private var stderrPipe: FileDescriptor?
    /// Whether the exit descriptor is in the loop's epoll set.
    @exclusivity(unchecked) var exitWatched = false
    /// The page its runtime registered its exit notice in, if it was given one (ExitNotice.swift).
    let exitNotice: ExitNoticePage?
    /// Whether the exit-notice watcher has its page.
    @exclusivity(unchecked) var exitNoticeWatched = false
    /// The IPC socket.
    let connection: FramedConnection

    /// Requests sent to this worker whose `complete`/`cancelled` has not arrived.
    @exclusivity(unchecked) var inFlight: Set<RequestID> = []
    /// Partial results received per request and not yet credited back (at most `streamWindow` each).
    @exclusivity(unchecked) var streamOutstanding: [RequestID: Int] = [:]
    /// Leaks this worker has reported (at most one per request it was sent is counted).
    @exclusivity(unchecked) var leaksReported = 0
    /// Ids this worker finished recently, to tell a late duplicate (dropped) from an unknown id (a violation).
    @exclusivity(unchecked) var recentlyFinished = RecentIDs(capacity: 256)
    @exclusivity(unchecked) var stderrTail = ByteTail(capacity: 64 * 1024)
    var stdoutLines = OutputLines()
    var stderrLines = OutputLines()
    /// The log lines its messages may cause (`HostEngine.logForWorker`).
    @exclusivity(unchecked) var messageLines = LineBudget()
    /// Reports what its three budgets (messages, stdout, stderr) dropped and have not counted, a second after the
    /// first such drop (`HostEngine.countDropsSoon`).
    @exclusivity(unchecked) var dropCountTimer: TimerID?
    /// The ping it has not answered yet, if any, and the time that counts against the worker (`AnswerClock`).
    @exclusivity(unchecked) var ping: AnswerClock?
    @exclusivity(unchecked) var pingSeq: Int64 = 0
    /// When a worker past its heartbeat timeout was first seen runnable, and its CPU time then: whether it gets a
    /// CPU is judged from there (`HostEngine.starvedNotHung`).
    @exclusivity(unchecked) var starvationCheck: StarvationCheck?
    @exclusivity(unchecked) var idleTimer: TimerID?
    /// Kills it if it has not exited in time after being retired or losing its socket.
    @exclusivity(unchecked) var exitTimer: TimerID?
    /// Requests the host abandoned (cancel, deadline) that the worker has not acknowledged yet, each with the
    /// timer that kills the worker if it ignores the cancel past the grace period.
    @exclusivity(unchecked) var cancelTimers: [RequestID: TimerID] = [:]
    /// Polls for the exit when the exit descriptor could not be watched.
    @exclusivity(unchecked) var reapPollTimer: TimerID?
    /// Sends SIGKILL again while it is killed, or over, and not yet reaped (`HostEngine.killAgainUntilReaped`).
    @exclusivity(unchecked) var killAgainTimer: TimerID?
    /// The private temp folder (TMPDIR), removed once the worker has exited.
    @exclusivity(unchecked) var temporaryDirectory: String?
    /// The layers its launcher reported (`sandboxed`), and what bestEffort skipped.
    @exclusivity(unchecked) var sandboxLayers: [String] = []
    @exclusivity(unchecked) var sandboxSkipped: [String] = []
    /// What each step of the launcher took, in µs (only when `HostConfiguration.measuresSandboxLayers`).
    @exclusivity(unchecked) var sandboxMicroseconds: [String: Int] = [:]
    @exclusivity(unchecked) var sandboxReported = false
    /// Whether `pid` is its own for good (`HostEngine.settlePid`): its `spawned` event is out and its requests'
    /// pids are published.
    @exclusivity(unchecked) var pidKnown = false
    /// The launcher's reason when it could not apply the sandbox (`launchFailed`).
    @exclusivity(unchecked) var launchFailure: String?
    /// Requests sent to it, ever.
    @exclusivity(unchecked) var requestsSent = 0
    /// `prewarm` calls waiting for its `welcome` (or its death).
    var readyWaiters: [@Sendable (Result<pid_t, RequestFailure>) -> Void] = []

    init(extensionID: String, policy: ExtensionPolicy, poolKey: String, app: String?,
         launched: consuming LaunchedWorker, loop: EventLoop, wireLimits: WireLimits)
    {
        self.extensionID = extensionID
        self.policy = policy
        self.poolKey = poolKey
        self.app = app
        child = launched.child
        pid = child.pid
        childPID = child.pid
        exitFD = child.exitDescriptor
        let socket = launched.socket.take()!
        let stdout = launched.stdout.take()!
        let stderr = launched.stderr.take()!
        stdoutFD = stdout.rawValue
        stderrFD = stderr.rawValue
        stdoutPipe = consume stdout
        stderrPipe = consume stderr
        exitNotice = launched.exitNotice
        connection = FramedConnection(socket, loop: loop, limits: wireLimits)
        startedAt = loop.now
    }

    var stdoutOpen: Bool { stdoutPipe != nil }
    var stderrOpen: Bool { stderrPipe != nil }

    /// Whether a new request may be sent to it now.
    var acceptsRequests: Bool {
        lifecycle.phase.isLive && connection.isOpen && inFlight.count < policy.maxConcurrentRequests
    }

    func closeStdout() { stdoutPipe.take()?.close() }
    func closeStderr() { stderrPipe.take()?.close() }

    /// Takes `reported` as the worker's pid if it is the host's child's own child (/proc/<pid>/stat says so), as
    /// the launcher's worker is. Returns whether it did. A worker cannot name another process this way.
    /// `signalDirectly`: the worker has no pid namespace of its own (its launcher is a subreaper): kills go to
    /// it, not to the launcher, which kills what the worker left once it has ended. Returns nil if it did not,
    /// else whether kills go to the worker.
    func adoptWorkerPID(_ reported: pid_t, signalDirectly: Bool) -> Bool? {
        guard reported > 0, reported != childPID else { return nil }
        let isChild = { [childPID] in parentPID(of: reported) == childPID }
        // Its pidfd is held before it is checked: a pid reused in between is then not the launcher's child.
        // `signalWorker` is true only if `isChild` held.
        let direct = signalDirectly && childOpen && child.signalWorker(reported, ifChild: isChild)
        guard direct || isChild() else { return nil }
        pid = reported
        starvationCheck = nil  // taken of the launcher, if any
        return direct
    }

    /// Records the kill (the first reason stands) and sends SIGKILL (through the pidfd, so never to a recycled
    /// pid). Returns whether this was the first.
    @discardableResult
    func kill(reason: InterruptionReason, forCancel: Bool = false) -> Bool {
        let first = lifecycle.markKilled(reason, forCancel: forCancel)
        finishOff()
        return first
    }

    /// Whether its process has yet to be reaped.
    var awaitsReap: Bool { lifecycle.phase != .dead }

    /// Sends SIGKILL without recording a reason: for a worker already ended (it is exiting, or must).
    func finishOff() {
        if childOpen { child.signal(SIGKILL) }
    }

    /// What the scheduler has given the worker's own process (`pid`), or nil.
    func schedulerTimes() -> SchedulerTimes? { child.schedulerTimes(of: pid) }

    /// Reaps the process if it has exited.
    func reap() throws(SystemError) -> ExitStatus? {
        guard childOpen else { return nil }
        return try child.reap()
    }

    /// Releases the exit descriptor (after it was unregistered from the loop).
    func closeChild() {
        guard childOpen else { return }
        childOpen = false
        child.close()
    }
}

/// A fixed-size memory of recently seen ids (oldest forgotten first). The ring grows as ids come (every worker has
/// one, and most never see `capacity` ids), then wraps.
struct RecentIDs {
    private var ring: [RequestID] = []
    private var set: Set<RequestID> = []
    /// The oldest, once the ring is full.
    private var next = 0
    let capacity: Int

    init(capacity: Int) {
        precondition(capacity > 0, "RecentIDs needs room for one id")
        self.capacity = capacity
    }

    mutating func insert(_ id: RequestID) {
        if ring.count < capacity {
            ring.append(id)
        } else {
            set.remove(ring[next])
            ring[next] = id
            next = (next + 1) % capacity
        }
        set.insert(id)
    }

    func contains(_ id: RequestID) -> Bool { set.contains(id) }
}

/// The last `capacity` bytes written to it.
struct ByteTail {
    private var ring: [UInt8] = []
    private var start = 0
    let capacity: Int

    init(capacity: Int) { self.capacity = capacity }

    mutating func append(_ chunk: UnsafeRawBufferPointer) {
        // Only the last `capacity` bytes of a large chunk can survive.
        let chunk = chunk.count > capacity ? UnsafeRawBufferPointer(rebasing: chunk[(chunk.count - capacity)...]) : chunk
        for byte in chunk {
            if ring.count < capacity {
                ring.append(byte)
            } else {
                ring[start] = byte
                start = (start + 1) % capacity
            }
        }
    }

    var bytes: [UInt8] { Array(ring[start...] + ring[..<start]) }
    var text: String { String(decoding: bytes, as: UTF8.self) }
}

/// The parent pid in /proc/<pid>/stat (field 4, read after the command, which may hold spaces and parentheses:
/// `statFields`), or nil.
func parentPID(of pid: pid_t) -> pid_t? {
    guard let bytes = try? readFile("/proc/\(pid)/stat"), let fields = statFields(bytes) else { return nil }
    return statField(fields, 4).flatMap { pid_t($0) }
}

extension WorkerProcess: PooledWorker {
    var countsAgainstMaxWorkers: Bool { lifecycle.phase.isLive }
}
