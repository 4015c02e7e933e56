// Fake workers for the engine's simulations (FoundationDB's and TigerBeetle's idea): a fake worker is a socket pair,
// two pipes, a counter that stands for its exit and an exit-notice page, living in the simulating process; the
// simulation decides, from a seeded generator, what each does and when. SimLauncher makes them in place of
// posix_spawn, with simulated descriptors (SimulatedKernel.swift) for the single-threaded simulation, or real
// ones for an engine on its own loop thread; SimExitNotices stands in for the exit-notice watcher thread. The files
// a begin brings are real descriptors, passed as SCM_RIGHTS passes them: a worker answers with those files.
import SDKWire
import SDKHost
import CSDKShim
import SDKPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One fake worker process. The engine's side (the WorkerChild) is called on the loop thread; the simulation's
/// side on the test thread; the shared part sits behind a Mutex.
package final class FakeWorker: WorkerChild, @unchecked Sendable {
    // @unchecked Sendable: `fds` and `pending` are used by the simulation thread only; `shared` is locked.
    package struct Shared {
        package var killRequested = false
        package var status: SDKPosix.ExitStatus?
        package var reaped = false
        package var exitFDOpen = true
        /// What the scheduler has given it, as a test sets it; nil: cannot be read.
        package var scheduler: SchedulerTimes?
    }
    package let pid: pid_t
    package let exitDescriptor: Int32
    package let shared = Mutex(Shared())
    /// The simulation's ends: socket, stdout and stderr write ends; -1 once closed.
    // `@exclusivity(unchecked)`: the harness's own state, touched by the simulating thread alone, read and written
    // after every step (the runtime's access checks on it were ~3% of a schedule).
    @exclusivity(unchecked) package var socket: Int32
    package var stdoutWrite: Int32
    package var stderrWrite: Int32
    /// What the host sent and the worker has not handled yet.
    @exclusivity(unchecked) private var inbox = SocketInbox()
    @exclusivity(unchecked) private var encoder = BinaryPlistEncoder()
    @exclusivity(unchecked) package var pending: [RequestID] = []
    /// The files a pending request's begin brought: its completion sends them back.
    @exclusivity(unchecked) package var files: [RequestID: [FileAttachment]] = [:]
    /// Its exit-notice page (the engine watches it once the worker has said hello).
    package let exitNotice: ExitNoticePage?
    /// The status its exit notice announced: what it dies with.
    package var noticedStatus: SDKPosix.ExitStatus?
    @exclusivity(unchecked) package var cancelRequested: Set<RequestID> = []
    /// Every id this worker was sent a begin for, in order.
    @exclusivity(unchecked) package var begins: [RequestID] = []
    @exclusivity(unchecked) package var alive = true
    /// The first id the host sent a begin for while this worker still ran a request of that id (one it never
    /// answered: say, a cancel it ignored). Never right: the new request's answer would settle the old one.
    @exclusivity(unchecked) package var beganWhileRunning: RequestID?
    /// Whether it answers a ping (a test makes it fall silent).
    @exclusivity(unchecked) package var answersPings = true
    /// Whether the schedule's checks have seen it reaped.
    @exclusivity(unchecked) package var notedReaped = false
    /// A slow start: it answers the host's hello only when the schedule says (`welcome(identifier:)`), and may die
    /// before it does.
    @exclusivity(unchecked) package var holdsWelcome = false
    /// The hello it has not answered yet, and what came after it: a runtime answers `hello` before it reads on,
    /// so a worker still starting takes nothing else in (it is seen read, for the late-begin check, as it comes).
    @exclusivity(unchecked) private var helloHeld = false
    @exclusivity(unchecked) private var heldAfterHello: [Message] = []

    /// Where its descriptors live: the simulated kernel, or (nil) the real one.
    let kernel: SimulatedKernel?

    package init(pid: pid_t, socket: Int32, stdoutWrite: Int32, stderrWrite: Int32, exitNotice: ExitNoticePage?,
                 kernel: SimulatedKernel?) {
        self.pid = pid
        self.exitNotice = exitNotice
        self.kernel = kernel
        exitDescriptor = kernel?.counter() ?? sdk_eventfd()
        self.socket = socket
        self.stdoutWrite = stdoutWrite
        self.stderrWrite = stderrWrite
    }

    // MARK: WorkerChild (loop thread)

    package func signal(_ signal: Int32) {
        shared.withLock { if $0.status == nil { $0.killRequested = true } }
    }

    package func schedulerTimes(of pid: pid_t) -> SchedulerTimes? { shared.withLock { $0.scheduler } }

    package func reap() throws(SystemError) -> SDKPosix.ExitStatus? {
        shared.withLock { s -> SDKPosix.ExitStatus? in
            guard let status = s.status, !s.reaped else { return nil }
            s.reaped = true
            return status
        }
    }

    package func close() {
        shared.withLock { $0.exitFDOpen = false }
        closeDescriptor(exitDescriptor)
    }

    // MARK: Simulation side

    /// The process ends: its descriptors close, then its exit becomes visible.
    package func die(_ status: SDKPosix.ExitStatus) {
        guard alive else { return }
        alive = false
        for fd in [socket, stdoutWrite, stderrWrite] where fd >= 0 { closeDescriptor(fd) }
        socket = -1
        stdoutWrite = -1
        stderrWrite = -1
        files = [:]
        heldAfterHello = []
        let final = noticedStatus ?? status
        shared.withLock { $0.status = $0.status ?? final }
        _ = withUnsafeBytes(of: UInt64(1)) { one in
            if let kernel { kernel.send(exitDescriptor, one, descriptors: []) } else { write(exitDescriptor, one.baseAddress, 8) }
        }
    }

    private func closeDescriptor(_ fd: Int32) {
        if let kernel { kernel.close(fd) } else { Glibc.close(fd) }
    }

    package func send(_ message: Message) {
        guard alive else { return }
        // As the runtime encodes (no dictionary built first).
        var bytes: [UInt8] = []
        var outgoing = OutgoingDescriptors()
        try! outgoing.encode(message, with: &encoder, appendingTo: &bytes)
        let descriptors = message.fileAttachments.map { $0.rawDescriptor }
        _ = bytes.withUnsafeBytes { try? sendNonBlocking(socket, $0, descriptors: descriptors) }
    }

    /// Half a frame (a header promising 100 bytes, then 10 of them): what a worker dying as it writes leaves.
    package func sendHalfAFrame() {
        guard alive else { return }
        let half: [UInt8] = [0, 0, 0, 100] + Array("bplist00xx".utf8)
        _ = half.withUnsafeBytes { try? sendNonBlocking(socket, $0, descriptors: []) }
    }

    /// Ends a slow start: the welcome now if the hello came, at once when it comes otherwise.
    package func welcome(identifier: String) {
        holdsWelcome = false
        if helloHeld {
            helloHeld = false
            send(.welcome(version: protocolVersion, identifier: identifier, pid: pid))
            let held = heldAfterHello
            heldAfterHello = []
            for message in held { take(message, identifier: identifier) }
        }
    }

    /// Reads what the host sent (its socket is readable); answers hello and ping at once, records begins and
    /// cancels. Returns whether the host closed the socket.
    package func pump(identifier: String) -> Bool {
        guard alive else { return false }
        let endOfFile = inbox.readAll(from: socket)
        while let message = inbox.nextMessage(scanningBegins: true) {
            if case .begin(let id, _, _, _) = message { begins.append(id) }
            if helloHeld {
                heldAfterHello.append(message)
            } else {
                take(message, identifier: identifier)
            }
        }
        return endOfFile
    }

    private func take(_ message: Message, identifier: String) {
        switch message {
        case .hello:
            if holdsWelcome { helloHeld = true } else { send(.welcome(version: protocolVersion, identifier: identifier, pid: pid)) }
        case .ping(let seq): if answersPings { send(.pong(seq: seq)) }
        case .begin(let id, let items, _, _):
            if beganWhileRunning == nil, pending.contains(id) { beganWhileRunning = id }
            pending.append(id)
            let brought = items.flatMap { $0.fileAttachments }
            if !brought.isEmpty { files[id] = brought }
        case .cancel(let id): cancelRequested.insert(id)
        default: break
        }
    }
}

/// Frames and descriptors read from a simulated peer's socket, as a runtime or the client library would take
/// them: descriptors owned from the moment they arrive, each frame's claimed with it.
struct SocketInbox {
    private var reader = FrameReader()
    private var incoming = IncomingDescriptors()
    private var buffer = [UInt8](uninitializedCount: 16384)

    /// Reads everything `socket` (non-blocking) holds, until EAGAIN. Returns whether the peer has gone (end of
    /// file, or a reset: it closed with something of ours unread). A short read does not mean the socket is
    /// empty: a read stops after the bytes that brought descriptors.
    mutating func readAll(from socket: Int32) -> Bool {
        // A simulated socket with nothing to read (no bytes, no end, no reset) is not read: most are idle at most
        // steps, and a read that finds nothing cost as much as the step's own work.
        if SimulatedKernel.isSimulated(socket), let kernel = SimulatedKernel.current, kernel.readiness(socket) & SDK_EPOLLIN == 0 {
            // A closed descriptor also reads as idle: reading it would be the descriptor bug the read reports.
            precondition(kernel.isOpen(socket), "recvmsg(\(socket)): simulated descriptor not open — a descriptor bug")
            return false
        }
        var received: [Int32] = []
        while true {
            var truncated = false
            let result = buffer.withUnsafeMutableBytes { raw in
                Result { () throws(SystemError) in try receiveNonBlocking(socket, into: raw, descriptors: &received, truncated: &truncated) }
            }
            _ = incoming.adopt(&received, truncated: truncated)
            switch result {
            case .success(.bytes(let n)):
                buffer.withUnsafeBytes { reader.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
            case .success(.endOfFile), .failure:
                return true
            case .success(.wouldBlock):
                return false
            }
        }
    }

    /// The next whole message read, or nil (none, or one that does not decode). With `scanningBegins`, a `begin`
    /// that brings no files comes without its items: a fake worker records the id and would throw them away.
    /// With `skippingStatusReports`, a status report is checked as a decode would check it and passed over
    /// unbuilt: a client never looks inside one, and building it cost more than the rest of what it reads.
    mutating func nextMessage(scanningBegins: Bool = false, skippingStatusReports: Bool = false) -> Message? {
        let limits = reader.limits
        while skippingStatusReports {
            var peek = reader
            let skipped = try? peek.withNextPayload { payload throws(WireError) in
                ForwardScan.isStatusReport(payload, limits: limits)
            }
            guard skipped == true else { break }
            reader = peek
        }
        return try? incoming.nextMessage(from: &reader, buildingBeginItems: !scanningBegins)
    }
}

/// Workers' temp folders, in memory (`HostConfiguration.workerFolders`): the engine makes one for each worker and
/// removes it when the worker is gone; a schedule ends with none left and none removed that was not made.
package final class SimWorkerFolders: WorkerFolders, @unchecked Sendable {
    // @unchecked Sendable: its state is behind the Mutex.
    private let state = Mutex<(made: Int, live: Set<String>, problem: String?)>((0, [], nil))

    package init() {}

    package func make(in base: String) throws(HostError) -> String {
        state.withLock { s in
            s.made += 1
            let folder = "\(base)/sim-worker.\(s.made)"
            s.live.insert(folder)
            return folder
        }
    }

    @discardableResult
    package func remove(_ folder: String) -> Bool {
        state.withLock { s in
            if s.live.remove(folder) == nil, s.problem == nil {
                s.problem = "the worker folder \(folder) was removed but never made, or removed twice"
            }
            return true
        }
    }

    /// Folders made and not removed, sorted.
    package var live: [String] { state.withLock { $0.live.sorted() } }
    /// The first removal of a folder that was not there.
    package var problem: String? { state.withLock { $0.problem } }
}

/// Creates fake workers; can be told to fail the next spawn.
package final class SimLauncher: WorkerLauncher, @unchecked Sendable {
    // @unchecked Sendable: `workers`, `failNext` and `slowNext` are behind the Mutex.
    private let state = Mutex<(workers: [FakeWorker], failNext: Bool, slowNext: Bool, nextPid: pid_t)>(([], false, false, 900_000))

    /// The exit-notice watcher the engine is given (`HostConfiguration.exitNoticeWatcher`).
    package let notices = SimExitNotices()

    /// Where the workers' descriptors live: a simulated kernel (the single-threaded simulation's: no syscalls), or
    /// (nil) the real one, for an engine on a loop thread of its own.
    let kernel: SimulatedKernel?

    package init(kernel: SimulatedKernel? = nil) {
        self.kernel = kernel
    }

    package var workers: [FakeWorker] { state.withLock { $0.workers } }
    package func failNextSpawn() { state.withLock { $0.failNext = true } }
    /// The next worker starts slowly (`FakeWorker.holdsWelcome`).
    package func slowNextSpawn() { state.withLock { $0.slowNext = true } }

    package func launch(_ request: SpawnRequest) throws(SystemError) -> LaunchedWorker {
        let fail = state.withLock { s -> Bool in
            defer { s.failNext = false }
            return s.failNext
        }
        if fail { throw SystemError("posix_spawn", errno: EAGAIN, detail: "simulated") }
        var sv: [Int32] = [-1, -1], out: [Int32] = [-1, -1], err: [Int32] = [-1, -1]
        if let kernel {
            // Simulated descriptors (SimulatedKernel.swift): non-blocking, and no syscalls.
            (sv[0], sv[1]) = kernel.socketPair()
            (out[0], out[1]) = kernel.pipe()
            (err[0], err[1]) = kernel.pipe()
        } else {
            socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0, &sv)
            _ = sdk_pipe_cloexec(&out)
            _ = sdk_pipe_cloexec(&err)
            // Both ends of the socket: the engine's, and the fake worker's, which reads until EAGAIN.
            for fd in [sv[0], sv[1], out[0], err[0]] { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
        }
        let (pid, slow) = state.withLock { s -> (pid_t, Bool) in
            s.nextPid += 1
            defer { s.slowNext = false }
            return (s.nextPid, s.slowNext)
        }
        // The page alone, with no memfd: that would be the worker's descriptor 5, and this worker has no process.
        let page = ExitNoticePage.unshared()
        let worker = FakeWorker(pid: pid, socket: sv[1], stdoutWrite: out[1], stderrWrite: err[1], exitNotice: page, kernel: kernel)
        worker.holdsWelcome = slow
        state.withLock { $0.workers.append(worker) }
        return LaunchedWorker(child: worker, socket: FileDescriptor(adopting: sv[0]),
                              stdout: FileDescriptor(adopting: out[0]), stderr: FileDescriptor(adopting: err[0]),
                              exitNotice: worker.exitNotice)
    }
}

/// Stands in for the exit-notice watcher thread: it keeps each watch, and the schedule reports a notice when it
/// chooses (`fire`), on its own thread, as the watcher would from its.
package final class SimExitNotices: ExitNoticeWatching, @unchecked Sendable {
    // @unchecked Sendable: `watches` is behind the Mutex.
    private let watches = Mutex<[ObjectIdentifier: @Sendable (ExitNoticeWatcher.Notice) -> Void]>([:])

    package init() {}

    package func watch(_ page: ExitNoticePage, notice: @escaping @Sendable (ExitNoticeWatcher.Notice) -> Void) -> Bool {
        watches.withLock { $0[ObjectIdentifier(page)] = notice }
        return true
    }

    package func unwatch(_ page: ExitNoticePage) {
        _ = watches.withLock { $0.removeValue(forKey: ObjectIdentifier(page)) }
    }

    /// Whether `page` is watched.
    package func isWatched(_ page: ExitNoticePage) -> Bool { watches.withLock { $0[ObjectIdentifier(page)] != nil } }

    /// Reports `notice` for `page`, ending its watch (as the watcher does); false if it was not watched.
    package func fire(_ page: ExitNoticePage, _ notice: ExitNoticeWatcher.Notice) -> Bool {
        guard let report = watches.withLock({ $0.removeValue(forKey: ObjectIdentifier(page)) }) else { return false }
        report(notice)
        return true
    }

    /// Watches still held (none once every worker has ended).
    package var count: Int { watches.withLock { $0.count } }
}
