// WorkerRuntime: the worker's main loop. The main thread owns the socket (fd 3, set up by the host's spawn):
// it reads frames, answers pings itself (so a busy handler never looks hung), dispatches `begin` to the
// handler and `cancel` to the request's context. Handlers finish requests from any thread; frames go out
// under one lock. The process exits on EOF (host gone), on parent death, on a protocol error from the host,
// or after a long idle period (a backstop: the host normally retires idle workers itself by closing the socket).

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import Dispatch
import CSDKShim
import SDKPosix
import Synchronization

enum WorkerLog {
    static let pid = getpid()
    static func write(_ message: String) {
        var line = "sdk-extension[\(pid)]: \(message)\n"
        line.withUTF8 { _ = Glibc.write(2, $0.baseAddress, $0.count) }
    }
}

/// The connection to the host, shared by the main loop and the handler threads.
final class HostConnection: Sendable {
    let fd: Int32
    /// Frames waiting to be written, and whether some thread is writing. Completions from many handler threads
    /// are coalesced: a thread that finds another one writing appends its frame and returns.
    private struct Outbox {
        var encoder = BinaryPlistEncoder()
        var pending: [UInt8] = []
        var spare: [UInt8] = []
        /// Where in `pending` the frames that carry descriptors start (they stay open until sent).
        var outgoing = OutgoingDescriptors()
        var writing = false
        /// The reader thread while it handles the frames of one read (0: none). What that thread sends meanwhile
        /// (an inline handler's replies, pongs) waits for `uncork`, so several leave in one write and wake the host
        /// once. Other threads are not held: their `send` has written, or handed to a writing thread, before it
        /// returns, as before.
        var corkedBy: UInt = 0
    }
    private let outbox = Mutex(Outbox())
    private let registry = Mutex(Registry())

    /// Requests in progress, and (for the leak check) those that ended while their context was still held.
    private struct Registry {
        var active: [RequestID: ExtensionContext] = [:]
        /// Ended, context not yet released, not yet reported: when it ended. A reported one leaves (a hoarding
        /// extension must not make this scan, or this table, grow with every request it leaks).
        var lingering: [RequestID: UInt64] = [:]
        /// Async handlers' Tasks still running.
        var runningTasks: Set<RequestID> = []
    }

    /// The reader (the main thread, which makes the connection): it answers pings, so it must never wait on the
    /// outbox for long.
    private let reader = UInt(pthread_self())

    init(fd: Int32) { self.fd = fd }

    /// Sends one message; a host that has gone away ends the process.
    /// Returns whether the message was queued (false: it could not be encoded, e.g. too large for a frame).
    @discardableResult
    func send(_ message: Message) -> Bool {
        let me = UInt(pthread_self())
        if me != reader {
            switch message {
            case .complete, .partial, .hostCall: return sendEncodedApart(message)
            default: break
            }
        }
        let (appended, queued, failure) = outbox.withLock { (o: inout Outbox) -> (Bool, Bool, String?) in
            let (appended, failure) = Self.encode(message, with: &o.encoder, onto: &o.pending, descriptors: &o.outgoing)
            guard appended, !o.writing, o.corkedBy != me else { return (appended, false, failure) }
            o.writing = true
            return (appended, true, failure)
        }
        if let failure { WorkerLog.write(failure) }
        if queued { writePending() }
        return appended
    }

    /// A handler thread's reply, partial result or host call, which may be large: encoded into a buffer of its own before
    /// the outbox is locked, so that the reader's pongs never wait for it (encoding a 17 MiB reply took over the
    /// host's 10 s heartbeat timeout on a loaded machine, and the worker was killed as hung). Only the
    /// appending is done under the lock.
    private func sendEncodedApart(_ message: Message) -> Bool {
        var encoder = BinaryPlistEncoder()
        var bytes: [UInt8] = []
        var descriptors = OutgoingDescriptors()
        let (appended, failure) = Self.encode(message, with: &encoder, onto: &bytes, descriptors: &descriptors)
        let queued = appended && outbox.withLock { (o: inout Outbox) -> Bool in
            o.outgoing.append(descriptors, at: o.pending.count)
            o.pending.append(contentsOf: bytes)
            if o.writing { return false }
            o.writing = true
            return true
        }
        if let failure { WorkerLog.write(failure) }
        if queued { writePending() }
        return appended
    }

    /// Encodes `message` as a frame onto `bytes`, noting its descriptors. A reply too large for a frame still
    /// ends its request: its cancellation, with an error saying why, goes instead. Returns whether a frame was
    /// appended, and what to log.
    private static func encode(_ message: Message, with encoder: inout BinaryPlistEncoder, onto bytes: inout [UInt8],
                               descriptors: inout OutgoingDescriptors) -> (appended: Bool, failure: String?)
    {
        do throws(WireError) {
            try descriptors.encode(message, with: &encoder, appendingTo: &bytes)
            return (true, nil)
        } catch {
            guard case .complete(let id, _) = message else { return (false, "cannot send '\(message.typeName)': \(error)") }
            // Nested past the limit is not "too large": said as what it is.
            let what = error.code == .tooDeep ? "reply cannot be encoded" : "reply too large"
            let refusal = Message.cancelled(id: id, error: ExtensionError(
                domain: "SDKExtension", code: 3, message: "\(what): \(error.detail)"))
            try? Frame.encode(refusal.plist, with: &encoder, appendingTo: &bytes)
            return (true, "\(what) for \(id): \(error.detail)")
        }
    }

    /// How many of one read's frames the reader handles before it sends the replies held meanwhile. Sending each
    /// reply at once cost the worker a write, and the host a wake-up, per request; holding a whole read (up to
    /// 64 KiB of frames) made the two sides take turns instead of working at once. In `bench throughput` at 64 in
    /// flight, 8 did best: embedded req/s ~94k -> ~121k, and ~115k -> ~140k with handlers on the host loop
    /// (3 to 6 alternating runs each; 2, 4, 16 and a whole read each did worse on one figure or both). The cost:
    /// a worker that dies while replies are held loses them, and those requests end as interrupted. Only the
    /// reader's own replies are held, so that window is the inline handlers' (RequestHandler.runsInline).
    static let framesPerCork = 8

    /// Holds what this thread sends until `uncork` (the reader, around the frames of one read).
    func cork() {
        let me = UInt(pthread_self())
        outbox.withLock { $0.corkedBy = me }
    }

    /// Sends what was held since `cork`, unless another thread is writing (it takes it along).
    func uncork() {
        let write = outbox.withLock { o -> Bool in
            o.corkedBy = 0
            guard !o.writing, !o.pending.isEmpty else { return false }
            o.writing = true
            return true
        }
        if write { writePending() }
    }

    /// Sends what is held now and goes on holding (the reader, mid-read).
    func writeHeld() {
        uncork()
        cork()
    }

    /// Writes until the outbox is empty, taking whatever other threads add meanwhile (the caller set `writing`).
    /// Two buffers rotate (pending <-> spare), so steady state allocates nothing.
    private func writePending() {
        while true {
            var (batch, outgoing) = outbox.withLock { o -> ([UInt8], OutgoingDescriptors) in
                if o.pending.isEmpty {
                    o.writing = false
                    return ([], OutgoingDescriptors())
                }
                var taken = o.spare
                o.spare = []
                swap(&taken, &o.pending)
                defer { o.outgoing = OutgoingDescriptors() }
                return (taken, o.outgoing)
            }
            if batch.isEmpty { return }
            // A typed-throws closure here crashes the 6.3 compiler (IRGen thunk); carry the error in a Result.
            let sent = batch.withUnsafeBytes { raw in
                Result { () throws(SystemError) in
                    // Each frame that carries descriptors goes out with them attached to its first byte.
                    var from = 0
                    while from < raw.count {
                        let (end, descriptors) = outgoing.nextWrite(from: from, upTo: raw.count)
                        try sendAll(fd, UnsafeRawBufferPointer(rebasing: raw[from..<end]), descriptors: descriptors)
                        outgoing.wrote(from: from)
                        from = end
                    }
                }
            }
            outgoing.removeAll()
            if case .failure(let error) = sent {
                WorkerLog.write("host connection lost: \(error)")
                exit(0)
            }
            batch.removeAll(keepingCapacity: true)
            outbox.withLock { $0.spare = batch }
        }
    }

    func register(_ context: ExtensionContext) { registry.withLock { $0.active[context.requestID] = context } }
    func context(for id: RequestID) -> ExtensionContext? { registry.withLock { $0.active[id] } }
    var activeCount: Int { registry.withLock { $0.active.count } }

    /// The request ended. With the leak check on, it lingers until its context is released.
    func ended(_ id: RequestID, watch: Bool) {
        let now = watch ? monotonicNanoseconds() : 0
        registry.withLock { r in
            guard r.active.removeValue(forKey: id) != nil, watch else { return }
            r.lingering[id] = now
        }
    }

    /// The context of an ended request was released: nothing of it is left.
    func released(_ id: RequestID) { _ = registry.withLock { $0.lingering.removeValue(forKey: id) } }

    func taskStarted(_ id: RequestID) { _ = registry.withLock { $0.runningTasks.insert(id) } }
    func taskEnded(_ id: RequestID) { _ = registry.withLock { $0.runningTasks.remove(id) } }

    /// Requests that ended at least `delay` ago and still hold their context (and maybe their Task), each
    /// reported once.
    func leaks(olderThan delay: UInt64) -> [Message] {
        let now = monotonicNanoseconds()
        return registry.withLock { r in
            guard !r.lingering.isEmpty else { return [] }
            var found: [Message] = []
            for (id, endedAt) in r.lingering where now &- endedAt >= delay {
                let alive = r.runningTasks.contains(id) ? ["context", "task"] : ["context"]
                found.append(.leak(id: id, alive: alive, afterMs: Int64((now &- endedAt) / 1_000_000)))
            }
            for case .leak(let id, _, _) in found { r.lingering.removeValue(forKey: id) }
            return found
        }
    }
}

enum WorkerRuntime {
    typealias SyncBody = @Sendable (ExtensionContext) -> Void
    typealias AsyncBody = @Sendable (ExtensionContext) async -> Void

    static func run(_ sync: SyncBody?, inline: Bool, async asyncBody: AsyncBody?) -> Never {
        let env = Environment()
        signal(SIGPIPE, SIG_IGN)
        // stdout is a pipe, so stdio would buffer `print()` in 4 KiB blocks that a crash or kill loses: one line
        // at a time instead, so each line reaches the host log as it is printed.
        sdk_line_buffer_stdout()
        // Dying with the host, the memory limit and the rest of the sandbox are the launcher's work
        // (sdk-host-launcher): they hold whether or not an extension links this runtime.
        // The host learns of this process's death from the kernel's robust-futex walk, before its memory is torn
        // down (the host's ExitNotice.swift). Registered from the main thread: the host reads whether the process
        // is exiting, and with what status, from /proc/<pid>/stat, which shows the main thread.
        if let fd = env.exitNoticeFD {
            let error = sdk_exit_notice_register(fd)
            if error != 0 { WorkerLog.write("exit notice unavailable: \(String(cString: strerror(error)))") }
        }
        let connection = HostConnection(fd: env.ipcFD)
        let hostCaller = HostCaller(maxInFlight: env.maxHostCalls) { [connection] message in connection.send(message) }
        var reader = FrameReader()
        // Not zero-filled: only the bytes a read returns are used, and a filled 64 KiB buffer was 16 page faults
        // at every worker's start.
        var buffer = [UInt8](unsafeUninitializedCapacity: 64 * 1024) { _, count in count = 64 * 1024 }
        // Descriptors received and not yet claimed by a complete frame (see the host's FramedConnection).
        var receivedRaw: [Int32] = []
        var incoming = IncomingDescriptors()
        var idleTimeoutMs = env.idleTimeoutMs
        var lastBegin = monotonicNanoseconds()
        // The leak check: a request's context (and an async handler's Task) should be gone this long after the
        // request ended; checked at most every quarter second, from this loop.
        let leakDelay = env.leakCheckMs > 0 ? UInt64(env.leakCheckMs) * 1_000_000 : nil
        var nextLeakCheck = lastBegin
        // Busy polling as the host's loop does (EventLoop.swift): after a read, poll for a moment before sleeping,
        // so the next request of a one-at-a-time caller finds this thread awake.
        let busyPollNanoseconds = UInt64(env.busyPollMicroseconds) * 1000
        var lastPollFoundWork = false

        while true {
            // The idle backstop is twice the host's idle timeout: the host retires us first in normal operation.
            var pfd = pollfd(fd: connection.fd, events: Int16(POLLIN), revents: 0)
            let timeout: Int32 = idleTimeoutMs > 0 ? Int32(min(idleTimeoutMs, 1000)) : 1000
            var ready: Int32 = 0
            if busyPollNanoseconds > 0, lastPollFoundWork {
                ready = busyPoll(nanoseconds: busyPollNanoseconds) { poll(&pfd, 1, 0) }
            }
            if ready == 0 { ready = poll(&pfd, 1, leakDelay == nil ? timeout : min(timeout, 250)) }
            lastPollFoundWork = ready > 0
            if let leakDelay, monotonicNanoseconds() >= nextLeakCheck {
                nextLeakCheck = monotonicNanoseconds() + 250_000_000
                for leak in connection.leaks(olderThan: leakDelay) { connection.send(leak) }
            }
            if ready < 0 {
                if errno == EINTR { continue }
                WorkerLog.write("poll failed: \(String(cString: strerror(errno)))")
                exit(1)
            }
            if ready == 0 {
                if idleTimeoutMs > 0, connection.activeCount == 0,
                    monotonicNanoseconds() - lastBegin > UInt64(idleTimeoutMs) * 2_000_000
                {
                    exit(0)
                }
                continue
            }
            var truncated = false
            let received = buffer.withUnsafeMutableBytes { raw in
                Result { () throws(SystemError) in
                    try receiveNonBlocking(connection.fd, into: raw, descriptors: &receivedRaw, truncated: &truncated)
                }
            }
            if !receivedRaw.isEmpty || truncated, let problem = incoming.adopt(&receivedRaw, truncated: truncated) {
                WorkerLog.write("protocol error from host: \(problem); exiting")
                exit(2)
            }
            let n: Int
            switch received {
            case .success(.bytes(let count)): n = count
            case .success(.endOfFile), .failure: exit(0)  // the host closed the connection
            case .success(.wouldBlock): continue
            }
            buffer.withUnsafeBytes { reader.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
            // The replies to this read's frames (an inline handler's, pongs) leave in writes of up to
            // `framesPerCork` frames' worth, not one write each.
            connection.cork()
            defer { connection.uncork() }
            var corkedFrames = 0
            while true {
                corkedFrames += 1
                if corkedFrames > HostConnection.framesPerCork {
                    corkedFrames = 1
                    connection.writeHeld()
                }
                let message: Message
                do {
                    guard let next = try incoming.nextMessage(from: &reader) else { break }
                    message = next
                } catch {
                    connection.uncork()  // the replies already made still count
                    WorkerLog.write("protocol error from host: \(error); exiting")
                    exit(2)
                }
                switch message {
                case .hello(let version, _, _, let idle):
                    if version != protocolVersion {
                        WorkerLog.write("host speaks protocol \(version), we speak \(protocolVersion); exiting")
                        exit(2)
                    }
                    idleTimeoutMs = idle
                    connection.send(.welcome(version: protocolVersion, identifier: env.identifier, pid: getpid()))
                    // Never held: a worker that dies before its welcome is out is one that died before its
                    // handshake, and the host sends its requests again to the next worker. A begin read with the
                    // hello whose handler crashed would then run again.
                    connection.writeHeld()
                case .begin(let id, let items, _, _):
                    lastBegin = monotonicNanoseconds()
                    let watch = leakDelay != nil
                    let onRelease: (@Sendable (RequestID) -> Void)? = watch ? { @Sendable [connection] id in connection.released(id) } : nil
                    let context = ExtensionContext(
                        requestID: id, inputItems: items,
                        finish: { [connection] message in
                            connection.ended(id, watch: watch)
                            connection.send(message)
                        },
                        partial: { [connection] message in connection.send(message) },
                        onRelease: onRelease, hostCaller: hostCaller)
                    connection.register(context)
                    if env.conformance, Conformance.isCommand(items) {
                        DispatchQueue.global().async { Conformance.handle(context) }
                    } else if let sync {
                        if inline {
                            sync(context)
                        } else {
                            DispatchQueue.global().async { sync(context) }
                        }
                    } else if let asyncBody {
                        if watch { connection.taskStarted(id) }
                        let ended: (@Sendable () -> Void)? = watch ? { @Sendable [connection] in connection.taskEnded(id) } : nil
                        context.runAsync(asyncBody, ended: ended)
                    }
                case .cancel(let id):
                    connection.context(for: id)?.markCancelledByHost()
                case .credit(let id, let count):
                    connection.context(for: id)?.credit(Int(clamping: count))
                case .ping(let seq):
                    connection.send(.pong(seq: seq))
                case .hostCallResult, .hostCallError:
                    hostCaller.answer(message)
                case .hostCall, .hostCallCancel, .pong, .welcome, .complete, .partial, .cancelled, .connect, .connected, .subscribe, .event, .assigned, .interrupted, .status,
                    .statusReport, .sandboxed, .launchFailed, .prewarm, .prewarmed, .leak:
                    WorkerLog.write("unexpected '\(message.typeName)' from host; ignored")
                case .error(let text, _):
                    WorkerLog.write("host reported: \(text)")
                case .unknown(let type):
                    WorkerLog.write("unknown message type '\(type)' from host; ignored")
                }
            }
            if let problem = incoming.unclaimedProblem(frameHalfRead: reader.bufferedByteCount > 0) {
                connection.uncork()
                WorkerLog.write("protocol error from host: \(problem); exiting")
                exit(2)
            }
        }
    }
}

/// What the host passes in the environment (see the host's WorkerProcess).
struct Environment {
    let ipcFD: Int32
    let identifier: String
    var idleTimeoutMs: Int64
    /// LeakCheckDelaySeconds in ms; 0 turns the check off.
    let leakCheckMs: Int64
    /// The host's BusyPollMicroseconds (0, sleep at once, when unset or out of range).
    let busyPollMicroseconds: Int
    /// The exit-notice page's descriptor, when the host passed one.
    let exitNoticeFD: Int32?
    /// MaxHostCallsInFlight: calls of one request to the host's services that may wait at once.
    let maxHostCalls: Int
    /// SDKHOST_CONFORMANCE=1: the runtime answers conformance requests itself (Conformance.swift).
    let conformance: Bool

    init() {
        func value(_ name: String) -> String? { getenv(name).map { String(cString: $0) } }
        ipcFD = value("SDKHOST_IPC_FD").flatMap { Int32($0) } ?? 3
        identifier = value("SDKHOST_EXTENSION_ID") ?? "unknown"
        idleTimeoutMs = value("SDKHOST_IDLE_TIMEOUT_MS").flatMap { Int64($0) } ?? 0
        leakCheckMs = value("SDKHOST_LEAK_CHECK_MS").flatMap { Int64($0) } ?? 0
        exitNoticeFD = value("SDKHOST_EXIT_NOTICE_FD").flatMap { Int32($0) }.flatMap { $0 > 2 ? $0 : nil }
        conformance = value("SDKHOST_CONFORMANCE") == "1"
        maxHostCalls = value("SDKHOST_MAX_HOST_CALLS").flatMap { Int($0) }.map { (1...1024).contains($0) ? $0 : 16 } ?? 16
        busyPollMicroseconds = value("SDKHOST_BUSY_POLL_US").flatMap { Int($0) }.map { (0...1000).contains($0) ? $0 : 0 } ?? 0
        var st = stat()
        if fstat(ipcFD, &st) != 0 {
            WorkerLog.write("no host connection on fd \(ipcFD): this program is an sdk-host extension; run it through sdk-host")
            exit(64)
        }
    }
}
