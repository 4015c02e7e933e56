// WorkerProcess: one spawned extension process as the host sees it. Loop-confined: every property is read
// and written on the engine's event-loop thread only. It owns the worker's socket, stdout/stderr pipes and
// pidfd, and closes each exactly once.

#if canImport(Glibc)
import Glibc
#endif
import SDKPosix

final class WorkerProcess {
    enum State: Equatable {
        /// Spawned; `hello` sent, `welcome` not yet received. Requests may already be queued on the socket.
        case starting
        /// Handshake done.
        case ready
        /// Idle and being retired (socket closed); takes no new requests.
        case retiring
        /// Reaped; all descriptors closed.
        case dead
    }

    let extensionID: String
    let policy: ExtensionPolicy
    let pid: pid_t
    let startedAt: UInt64
    var state = State.starting

    // Descriptors: the raw numbers stay valid until the matching `close…` call.
    let stdoutFD: Int32
    let stderrFD: Int32
    private var process: SpawnedProcess?
    private var stdoutPipe: FileDescriptor?
    private var stderrPipe: FileDescriptor?
    var pidfdRaw: Int32
    /// The IPC socket.
    let connection: FramedConnection

    /// Requests sent to this worker whose `complete`/`cancelled` has not arrived.
    var inFlight: Set<RequestID> = []
    /// Ids this worker finished recently, to tell a late duplicate (dropped) from an unknown id (a violation).
    var recentlyFinished = RecentIDs(capacity: 256)
    /// Set when the host decides to kill it; the interruption reason for its in-flight requests.
    var killReason: InterruptionReason?
    var stderrTail = ByteTail(capacity: 64 * 1024)
    var pingSentAt: UInt64?
    var pingSeq: Int64 = 0
    var idleTimer: TimerID?
    var retireKillTimer: TimerID?

    init(extensionID: String, policy: ExtensionPolicy, process: consuming SpawnedProcess,
         socket: consuming FileDescriptor, stdout: consuming FileDescriptor, stderr: consuming FileDescriptor,
         loop: EventLoop, wireLimits: WireLimits)
    {
        self.extensionID = extensionID
        self.policy = policy
        pid = process.pid
        pidfdRaw = process.pidfd.rawValue
        stdoutFD = stdout.rawValue
        stderrFD = stderr.rawValue
        self.process = consume process
        connection = FramedConnection(socket, loop: loop, limits: wireLimits)
        stdoutPipe = consume stdout
        stderrPipe = consume stderr
        startedAt = monotonicNanoseconds()
    }

    var stdoutOpen: Bool { stdoutPipe != nil }
    var stderrOpen: Bool { stderrPipe != nil }

    /// Whether a new request may be sent to it now.
    var acceptsRequests: Bool {
        (state == .starting || state == .ready) && connection.isOpen && killReason == nil
            && inFlight.count < policy.maxConcurrentRequests
    }

    func closeStdout() { stdoutPipe.take()?.close() }
    func closeStderr() { stderrPipe.take()?.close() }

    /// Sends SIGKILL (through the pidfd, so never to a recycled pid) and records why, once.
    func kill(reason: InterruptionReason) {
        if killReason == nil { killReason = reason }
        if let process = process.take() {
            process.signal(SIGKILL)
            self.process = consume process
        }
    }

    /// Reaps the process if it has exited; closes the pidfd when it has.
    func reap() -> ExitStatus? {
        guard let process = process.take() else { return nil }
        let status: ExitStatus?
        do {
            status = try process.reap()
        } catch {
            status = nil
        }
        if status != nil {
            process.close()
            pidfdRaw = -1
        } else {
            self.process = consume process
        }
        return status
    }
}

/// A fixed-size memory of recently seen ids (oldest forgotten first).
struct RecentIDs {
    private var ring: [RequestID?]
    private var set: Set<RequestID> = []
    private var next = 0

    init(capacity: Int) { ring = Array(repeating: nil, count: capacity) }

    mutating func insert(_ id: RequestID) {
        if let old = ring[next] { set.remove(old) }
        ring[next] = id
        set.insert(id)
        next = (next + 1) % ring.count
    }

    func contains(_ id: RequestID) -> Bool { set.contains(id) }
}

/// The last `capacity` bytes written to it.
struct ByteTail {
    private(set) var bytes: [UInt8] = []
    let capacity: Int

    init(capacity: Int) { self.capacity = capacity }

    mutating func append(_ chunk: UnsafeRawBufferPointer) {
        bytes.append(contentsOf: chunk)
        if bytes.count > capacity { bytes.removeFirst(bytes.count - capacity) }
    }

    var text: String { String(decoding: bytes, as: UTF8.self) }
}
