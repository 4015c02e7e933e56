// DaemonClient: the daemon-mode backend of ExtensionHost. It speaks the same protocol to `sdk-host serve` over
// a Unix socket, on an event loop of its own. When the daemon goes away every in-flight request is interrupted
// (`disconnected`) exactly once; the next request reconnects, with backoff, without the app doing anything.

import SDKWire
import Dispatch
import SDKPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// `@unchecked Sendable`: everything but `known` and `pids` (Mutex) is confined to `loop`'s thread.
final class DaemonClient: HostBackend, @unchecked Sendable {
    let loop: EventLoop
    let socketPath: String
    let limits = WireLimits()
    /// How long a request waits for a connection before it is interrupted (`disconnected`).
    let reconnectTimeout: Double
    /// How long the daemon may leave a ping unanswered, while anything waits on it, before this client gives the
    /// connection up as dead (a stopped or wedged daemon): its requests are interrupted (`disconnected`).
    let heartbeatTimeout: Double
    /// The ping the daemon has not answered yet: its seq and when it was sent.
    private var unansweredPing: (seq: Int64, sentAt: UInt64)?
    private var pingSeq: Int64 = 0
    private var heartbeatTimer: TimerID?
    private var queueExpiryTimer: TimerID?
    private let known = Mutex<(extensions: [ExtensionInfo], daemonPid: Int32, problems: [String: HostError])>(([], 0, [:]))
    /// Worker events from the daemon; the first stream subscribes (and every later connection does again).
    private var eventHub: EventHub!
    private var subscribed = false
    private let pids = SpinningMutex<[RequestID: pid_t]>([:])

    private var connection: FramedConnection?
    private var ready = false
    private var refusal: String?
    private var inFlight: [RequestID: SubmittedRequest] = [:]
    private var queued: [(request: SubmittedRequest, since: UInt64)] = []
    /// Requests this client ended itself (a cancel, a deadline the daemon let pass) whose outcome the daemon still
    /// owes: it is dropped without a warning when it comes. Emptied when the connection ends; at most
    /// `maxOwed` (past that a late outcome is logged as for an unknown request, nothing worse).
    private var owed: Set<RequestID> = []
    private static let maxOwed = 4096
    /// Each request with a deadline: the timer that ends it here if the daemon has not by then
    /// (`deadlineBackstopSeconds` after its deadline).
    private var deadlineTimers: [RequestID: TimerID] = [:]
    private var backoff = 0.02
    private var retryTimer: TimerID?
    private var readyWaiters: [(Result<Void, HostError>) -> Void] = []
    /// Each status asked for: who takes the report, and the timer that gives up on it.
    private var statusWaiters: [Int64: (answer: (PlistValue?) -> Void, timer: TimerID)] = [:]
    private var statusSeq: Int64 = 0
    private var prewarmWaiters: [RequestID: @Sendable (Result<pid_t, RequestFailure>) -> Void] = [:]
    /// The daemon's host calls running in the app, by request and the daemon's call number: what cancels each.
    private var hostCalls: [RequestID: [Int64: @Sendable () -> Void]] = [:]
    private var shuttingDown = false
    /// The client itself, from its shutdown until its loop has stopped: what the loop still runs meanwhile (a timer
    /// due in its last turn) holds it unowned. Without it, an app that dropped its host while a reconnect was due
    /// aborted ("Attempted to read an unowned reference"): the shutdown task had let the client go.
    private var keepAliveUntilStopped: DaemonClient?
    /// The app name sent in `connect`: with the peer's uid, it picks this app's own workers in the daemon.
    let appName: String

    /// The uid the daemon must run as (SO_PEERCRED); nil for this process's uid or root.
    let daemonUID: uid_t?

    /// Where the client's own log lines go (a daemon's error message, a reply for a request it no longer has);
    /// nil logs nothing.
    let logHandler: (@Sendable (LogLevel, String) -> Void)?

    init(socketPath: String, reconnectTimeout: Double, heartbeatTimeout: Double = 30, daemonUID: uid_t? = nil,
         appName: String? = nil, logHandler: (@Sendable (LogLevel, String) -> Void)? = nil) throws(HostError)
    {
        self.logHandler = logHandler
        self.appName = appName ?? currentExecutableName() ?? "app"
        self.socketPath = socketPath
        self.reconnectTimeout = reconnectTimeout
        self.heartbeatTimeout = heartbeatTimeout.isFinite && heartbeatTimeout > 0 ? heartbeatTimeout : 30
        self.daemonUID = daemonUID
        do {
            loop = try EventLoop(name: "sdk-host-client", busyPollMicroseconds: HostConfiguration.defaultBusyPollMicroseconds)
        } catch {
            throw HostError(.system, "cannot start the client event loop: \(error)")
        }
        eventHub = EventHub { [weak self] in
            guard let self else { return }
            self.loop.execute {
                self.subscribed = true
                if self.ready { try? self.connection?.send(.subscribe) } else { self.connectNow() }
            }
        }
    }

    /// Connects (or waits for the connection in progress) and calls `done` once the daemon has answered.
    func waitUntilReady(_ done: @escaping @Sendable (Result<Void, HostError>) -> Void) {
        let accepted = loop.execute {
            // A stopping loop still runs what was queued: after the shutdown, nothing connects or answers.
            if self.shuttingDown { return done(.failure(HostError(.daemonUnavailable, "the client was shut down"))) }
            if self.ready { return done(.success(())) }
            self.readyWaiters.append(done)
            self.connectNow()
        }
        if !accepted { done(.failure(HostError(.daemonUnavailable, "the client was shut down"))) }
    }

    // MARK: HostBackend

    var extensionIdentifiers: [String] { extensions.map(\.identifier) }
    var extensions: [ExtensionInfo] { known.withLock { $0.extensions } }
    var mode: HostMode { .daemon(socketPath: socketPath, pid: known.withLock { $0.daemonPid }) }
    func workerEvents() -> AsyncStream<WorkerEvent> { eventHub.stream() }
    func atEndOfTurn(_ body: @escaping @Sendable () -> Void) { loop.atEndOfTurn(body) }

    func lookupProblem(_ identifier: String) -> HostError? {
        let (names, problem) = known.withLock { ($0.extensions.map(\.identifier), $0.problems[identifier]) }
        if let problem { return problem }
        if names.contains(identifier) { return nil }
        return HostError(.unknownExtension, "unknown extension '\(identifier)' at daemon \(socketPath) "
            + "(known: \(names.isEmpty ? "none" : names.joined(separator: ", ")))")
    }

    /// Writes the begin frame from the caller's thread when connected and the loop is asleep
    /// (`EventLoop.executeInline`); anything else is the loop thread's.
    func submit(_ request: SubmittedRequest) {
        let accepted = loop.executeInline(when: { !self.shuttingDown && self.ready }) { self.submitOnLoop(request) }
        if !accepted { request.deliver(.interrupted(.hostShutdown)) }
    }

    private func submitOnLoop(_ request: SubmittedRequest) {
        if shuttingDown { return request.deliver(.interrupted(.hostShutdown)) }
        armDeadline(request)
        if ready {
            send(request)
        } else {
            queued.append((request, monotonicNanoseconds()))
            scheduleQueueExpiry()  // one timer at a time: a no-op while one runs
            if connection == nil && retryTimer == nil { connectNow() }
        }
    }

    /// Ends the request here at once, as an embedded host does, and tells the daemon (whose `cancelled` is then
    /// dropped): a daemon that does not answer (stopped, wedged) cannot hold the app's cancel.
    func cancel(_ id: RequestID) {
        loop.executeInline { self.endHere(id, .cancelled(.cancelledByHost)) }
    }

    /// Ends request `id` in this client with `outcome`, if it has not ended: in flight, the daemon is told to cancel
    /// it and its own outcome is dropped when it comes; queued, it is taken off the queue.
    private func endHere(_ id: RequestID, _ outcome: RequestOutcome) {
        if inFlight[id] != nil {
            try? connection?.send(.cancel(id: id))
            if owed.count >= Self.maxOwed { owed.removeAll() }
            owed.insert(id)
            finish(id, outcome)
        } else if let index = queued.firstIndex(where: { $0.request.id == id }) {
            let request = queued.remove(at: index).request
            disarmDeadline(id)
            loop.runOutsideInlineTask { request.deliver(outcome) }
        }
    }

    /// How long after a request's deadline this client ends it itself if the daemon has not: the daemon ends it at
    /// the deadline (and counts it in its status); this is for a daemon that cannot (stopped, wedged).
    static let deadlineBackstopSeconds = 1.0

    private func armDeadline(_ request: SubmittedRequest) {
        guard let deadline = request.deadline, deadline.isFinite else { return }
        let id = request.id
        // `nanoseconds` clamps as the engine's deadlines are clamped (a far deadline is never reached).
        deadlineTimers[id] = loop.schedule(afterNanoseconds: nanoseconds(max(deadline, 0) + Self.deadlineBackstopSeconds)) {
            [weak self] in
            guard let self, self.deadlineTimers.removeValue(forKey: id) != nil else { return }
            let sent = self.inFlight[id] != nil
            self.writeLog("request \(id): " + (sent
                ? "the daemon at \(self.socketPath) did not end it within \(Self.deadlineBackstopSeconds) s of its deadline"
                : "its deadline passed while it waited for the daemon at \(self.socketPath)") + "; ended here")
            self.endHere(id, .interrupted(.timedOut))
        }
    }

    private func disarmDeadline(_ id: RequestID) {
        if let timer = deadlineTimers.removeValue(forKey: id) { loop.cancelTimer(timer) }
    }

    func credit(_ id: RequestID, _ count: Int) {
        loop.executeInline {
            // The daemon passes it on to the worker, never beyond what the worker sent.
            if self.inFlight[id] != nil { try? self.connection?.send(.credit(id: id, count: Int64(count))) }
        }
    }

    func pid(for id: RequestID) -> pid_t? { pids.withLock { $0[id] } }

    func shutdown(completion: @escaping @Sendable () -> Void) {
        let accepted = loop.execute {
            guard !self.shuttingDown else { return completion() }
            self.shuttingDown = true
            self.keepAliveUntilStopped = self
            self.connection?.close()
            self.connection = nil
            self.ready = false
            for timer in [self.heartbeatTimer, self.retryTimer, self.queueExpiryTimer].compactMap({ $0 }) {
                self.loop.cancelTimer(timer)
            }
            self.heartbeatTimer = nil
            self.retryTimer = nil
            self.queueExpiryTimer = nil
            self.failAll(.hostShutdown)
            self.eventHub.finishAll()
            self.loop.stop { [self] in
                keepAliveUntilStopped = nil
                completion()
            }
        }
        if !accepted { completion() }
    }

    func status(_ body: @escaping @Sendable (HostStatus?) -> Void) {
        report { [self] report in
            guard let report else { return body(nil) }
            do {
                body(try HostStatus(plist: report))
            } catch {
                writeLog("the daemon's status does not read: \(error)")
                body(nil)
            }
        }
    }

    /// Asks the daemon to start a worker of `extensionID` for this app; `done` gets its pid once it is ready.
    func prewarm(_ extensionID: String, _ done: @escaping @Sendable (Result<pid_t, RequestFailure>) -> Void) {
        waitUntilReady { [self] result in
            guard case .success = result else { return done(.failure(.interrupted(.disconnected))) }
            let accepted = loop.execute {
                let id = RequestID()
                guard !self.shuttingDown else { return done(.failure(.interrupted(.hostShutdown))) }
                guard let connection = self.connection, (try? connection.send(.prewarm(id: id, extensionID: extensionID))) != nil
                else { return done(.failure(.interrupted(.disconnected))) }
                self.prewarmWaiters[id] = done
                self.scheduleHeartbeat()
            }
            if !accepted { done(.failure(.interrupted(.hostShutdown))) }
        }
    }

    /// Asks the daemon for its status report; `body` gets nil if the daemon cannot be reached, or does not answer
    /// within `reconnectTimeout` (a stopped or wedged daemon).
    func report(_ body: @escaping @Sendable (PlistValue?) -> Void) {
        waitUntilReady { result in
            guard case .success = result else { return body(nil) }
            let accepted = self.loop.execute {
                guard !self.shuttingDown, let connection = self.connection else { return body(nil) }
                self.statusSeq += 1
                let seq = self.statusSeq
                guard (try? connection.send(.status(seq: seq))) != nil else { return body(nil) }
                let timer = self.loop.schedule(afterNanoseconds: nanoseconds(self.reconnectTimeout)) { [weak self] in
                    guard let self, let waiter = self.statusWaiters.removeValue(forKey: seq) else { return }
                    self.writeLog("the daemon at \(self.socketPath) did not answer 'status' within \(self.reconnectTimeout) s")
                    waiter.answer(nil)
                }
                self.statusWaiters[seq] = (body, timer)
                self.scheduleHeartbeat()
            }
            if !accepted { body(nil) }
        }
    }

    // MARK: Connection (loop thread)

    private func connectNow() {
        guard connection == nil, !shuttingDown else { return }
        retryTimer = nil
        refusal = nil
        if let problem = Self.untrustedFolder(of: socketPath) {
            refusal = problem
            return connectFailed(problem)
        }
        let fd: FileDescriptor
        do {
            fd = try connectUnix(path: socketPath)
        } catch {
            return connectFailed("cannot connect to \(socketPath): \(String(cString: strerror(error.errno)))")
        }
        // Whoever listens there must be the daemon we expect, not another user who got to the path first.
        let trusted: [uid_t] = daemonUID.map { [$0] } ?? [getuid(), 0]
        guard let peer = try? peerCredentials(fd.rawValue), trusted.contains(peer.uid) else {
            let who = (try? peerCredentials(fd.rawValue)).map { "uid \($0.uid) (pid \($0.pid))" } ?? "an unknown peer"
            fd.close()
            refusal = "\(socketPath) is served by \(who), not by uid \(trusted.map(String.init).joined(separator: " or "))"
            return connectFailed(refusal!)
        }
        let c = FramedConnection(fd, loop: loop, limits: limits)
        do {
            try c.start(onMessage: { [unowned self] in self.handle($0) }, onEnd: { [unowned self] in self.disconnected($0) })
            try c.send(.connect(version: protocolVersion, app: appName))
        } catch {
            c.close()
            return connectFailed("cannot talk to \(socketPath): \(error)")
        }
        connection = c
        // A peer that accepts but never answers `connect` (a stuck daemon, or a socket whose listener nobody
        // serves) must not hold the caller forever.
        loop.schedule(afterNanoseconds: nanoseconds(reconnectTimeout)) { [weak self, weak c] in
            guard let self, let c, self.connection === c, !self.ready else { return }
            self.refusal = "the daemon at \(self.socketPath) did not answer 'connect' within \(self.reconnectTimeout) s"
            c.close()
            self.connection = nil
            self.failInFlight(.disconnected)
            self.connectFailed(self.refusal!)
        }
    }

    /// Why the socket's folder cannot be trusted (another user owns it, or others may write to it and so could
    /// put their own socket there), or nil.
    static func untrustedFolder(of socketPath: String) -> String? {
        let folder = socketPath.contains("/") ? String(socketPath[..<socketPath.lastIndex(of: "/")!]) : "."
        var st = stat()
        guard stat(folder.isEmpty ? "/" : folder, &st) == 0 else { return nil }  // connect reports the real error
        switch SocketFolderProblem(st) {
        case .ownedBy(let uid)?:
            return "the daemon's folder \(folder) belongs to uid \(uid), not to you (uid \(getuid())) or root"
        case .writableByOthers(let mode)?:
            return "the daemon's folder \(folder) is writable by others (mode \(String(mode, radix: 8))); "
                + "anyone could have put a socket there"
        case nil:
            return nil
        }
    }

    private func connectFailed(_ detail: String) {
        let waiters = readyWaiters
        readyWaiters = []
        for waiter in waiters { waiter(.failure(HostError(.daemonUnavailable, detail))) }
        if refusal != nil {
            failQueued(.disconnected)  // refused, not down: retrying cannot help
        } else if !queued.isEmpty || (subscribed && eventHub.hasSubscribers) {
            retryTimer = loop.schedule(afterNanoseconds: nanoseconds(backoff)) { [unowned self] in self.connectNow() }
            backoff = min(backoff * 2, 1)
        }
    }

    /// Pings the daemon a few times per `heartbeatTimeout` while anything waits on it (a request, a status, a
    /// prewarm); a ping unanswered for `heartbeatTimeout` ends the connection. An idle connection is not pinged.
    private func scheduleHeartbeat() {
        guard heartbeatTimer == nil, ready, waitsOnTheDaemon else { return }
        let every = max(heartbeatTimeout / 4, 0.05)
        heartbeatTimer = loop.schedule(afterNanoseconds: nanoseconds(every)) { [weak self] in
            guard let self else { return }
            self.heartbeatTimer = nil
            guard self.ready, let connection = self.connection else { return }
            if let ping = self.unansweredPing, monotonicNanoseconds() &- ping.sentAt >= nanoseconds(self.heartbeatTimeout) {
                // What came while this process was not running (stopped, starved) is read first: a pong queued
                // behind a large reply is the daemon's answer, late only on this side.
                connection.drain()
                guard self.connection === connection else { return }  // it ended while read
                if self.unansweredPing?.seq == ping.seq {
                    self.writeLog("the daemon at \(self.socketPath) has not answered a ping for \(self.heartbeatTimeout) s; "
                        + "giving the connection up")
                    connection.close()
                    self.disconnected(.broken("no answer to a ping for \(self.heartbeatTimeout) s"))
                    return
                }
            }
            if self.unansweredPing == nil, self.waitsOnTheDaemon {
                self.pingSeq += 1
                self.unansweredPing = (self.pingSeq, monotonicNanoseconds())
                try? connection.send(.ping(seq: self.pingSeq))
            }
            self.scheduleHeartbeat()
        }
    }

    /// Whether anything waits on the daemon (a request, a status, a prewarm): the heartbeat runs only then, so an
    /// idle connection neither pings nor wakes the loop.
    private var waitsOnTheDaemon: Bool { !inFlight.isEmpty || !statusWaiters.isEmpty || !prewarmWaiters.isEmpty }

    private func disconnected(_ end: ConnectionEnd) {
        connection = nil
        unansweredPing = nil
        if let timer = heartbeatTimer { loop.cancelTimer(timer) }
        heartbeatTimer = nil
        let wasReady = ready
        ready = false
        failInFlight(.disconnected)
        if wasReady {
            // Lost a working connection: the next request reconnects.
            backoff = 0.02
            if !queued.isEmpty || (subscribed && eventHub.hasSubscribers) { connectNow() }
        } else {
            connectFailed(refusal.map { "the daemon refused the connection: \($0)" } ?? "the daemon closed the connection (\(end))")
        }
    }

    private func handle(_ message: Message) {
        switch message {
        case .connected(_, let pid, let extensions, let points, let problems):
            // Also sent again after the daemon rescanned its manifests (SIGHUP): then only the list changes.
            let infos = extensions.sorted().map { ExtensionInfo(identifier: $0, extensionPointIdentifier: points[$0] ?? "") }
            let refusals = problems.mapValues(HostError.init(daemonProblem:))
            known.withLock { $0 = (infos, pid, refusals) }
            if ready { return }
            ready = true
            backoff = 0.02
            scheduleHeartbeat()
            if subscribed { try? connection?.send(.subscribe) }
            let pending = queued
            queued = []
            for (request, _) in pending { send(request) }
            let waiters = readyWaiters
            readyWaiters = []
            for waiter in waiters { waiter(.success(())) }
        case .assigned(let id, let pid):
            guard let request = inFlight[id] else { return }
            pids.withLock { $0[id] = pid }
            request.onWorkerAssigned?(pid)
        case .partial(let id, let items):
            if let progress = inFlight[id]?.progress {
                progress(items)
            } else if inFlight[id] != nil {
                try? connection?.send(.credit(id: id, count: 1))  // nobody takes partial results of this one
            }
        case .complete(let id, let items):
            finish(id, .completed(items))
        case .cancelled(let id, let error):
            finish(id, .cancelled(error))
        case .interrupted(let id, let reason):
            if let waiter = prewarmWaiters.removeValue(forKey: id) {
                waiter(.failure(.interrupted(InterruptionReason(plist: reason))))
            } else {
                finish(id, .interrupted(InterruptionReason(plist: reason)))
            }
        case .prewarmed(let id, let pid):
            prewarmWaiters.removeValue(forKey: id)?(.success(pid))
        case .event(let plist):
            if let event = WorkerEvent(plist: plist) { eventHub.publish(event) }
        case .statusReport(let seq, let report):
            if let waiter = statusWaiters.removeValue(forKey: seq) {
                loop.cancelTimer(waiter.timer)
                waiter.answer(report)
            }
        case .ping(let seq):
            try? connection?.send(.pong(seq: seq))
        case .pong(let seq):
            if unansweredPing?.seq == seq { unansweredPing = nil }
        case .hostCall(let id, let call, let service, let items):
            // A worker of one of this app's requests asks one of its services (only this app's requests' calls
            // come here: the daemon sends each to the connection that owns the request).
            guard let services = inFlight[id]?.services else {
                try? connection?.send(.hostCallError(id: id, call: call, error: inFlight[id] == nil
                    ? .hostCallRequestEnded : .serviceNotProvided(service)))
                return
            }
            hostCalls[id, default: [:]].removeValue(forKey: call)?()
            hostCalls[id, default: [:]][call] = services.start(HostServiceCall(service: service, requestID: id, items: items)) {
                [weak self] result in
                guard let self else { return }
                _ = self.loop.execute { self.hostCallAnswered(id, call, result) }
            }
        case .hostCallCancel(let id, let call):
            hostCalls[id]?.removeValue(forKey: call)?()
        case .error(let text, _):
            // The daemon's words reach the app's error and a terminal: bounded, and escaped when shown.
            if !ready { refusal = String(decoding: text.utf8.prefix(512), as: UTF8.self) }
            writeLog("daemon \(socketPath): \(text)")
        default:
            writeLog("daemon \(socketPath): unexpected message \(message); ignored")
        }
    }

    /// A deadline in seconds as the wire's milliseconds, clamped to what an Int64 holds: `.seconds(Int64.max)` was
    /// 9.2e21 ms, and converting it trapped, taking the app down. Nil (no deadline) for a NaN.
    static func milliseconds(_ seconds: Double) -> Int64? {
        let ms = (seconds * 1000).rounded(.up)
        if ms.isNaN { return nil }
        if ms >= Double(Int64.max) { return .max }  // 2^63: the first Double past Int64.max
        if ms <= Double(Int64.min) { return .min }
        return Int64(ms)
    }

    private func send(_ request: SubmittedRequest) {
        inFlight[request.id] = request
        scheduleHeartbeat()
        let deadlineMs = request.deadline.flatMap(Self.milliseconds)
        do {
            try connection?.send(.begin(id: request.id, items: request.items, extensionID: request.extensionID,
                                         deadlineMs: deadlineMs))
        } catch {
            finish(request.id, .interrupted(.protocolViolation(error.requestNotSent)))
        }
    }

    /// The app answered a host call: to the daemon, if the call is still the request's.
    private func hostCallAnswered(_ id: RequestID, _ call: Int64, _ result: Result<[ExtensionItem], ExtensionError>) {
        guard hostCalls[id]?.removeValue(forKey: call) != nil else { return }
        if hostCalls[id]?.isEmpty == true { hostCalls[id] = nil }
        switch result {
        case .success(let items):
            do {
                try connection?.send(.hostCallResult(id: id, call: call, items: items))
            } catch {
                try? connection?.send(.hostCallError(id: id, call: call, error: .answerNotSent(error.detail)))
            }
        case .failure(let error): try? connection?.send(.hostCallError(id: id, call: call, error: error))
        }
    }

    /// The request ended: the app's handlers of its calls still running are cancelled.
    private func cancelHostCalls(_ id: RequestID) {
        guard let calls = hostCalls.removeValue(forKey: id) else { return }
        for (_, cancel) in calls.sorted(by: { $0.key < $1.key }) { cancel() }
    }

    private func finish(_ id: RequestID, _ outcome: RequestOutcome) {
        cancelHostCalls(id)
        guard let request = inFlight.removeValue(forKey: id) else {
            // The outcome of one this client ended itself is expected; any other is the daemon's mistake.
            if owed.remove(id) == nil { writeLog("daemon \(socketPath): reply for unknown or finished request \(id); dropped") }
            return
        }
        disarmDeadline(id)
        pids.withLock { _ = $0.removeValue(forKey: id) }
        loop.runOutsideInlineTask { request.deliver(outcome) }
    }

    private func failInFlight(_ reason: InterruptionReason) {
        let lost = inFlight
        inFlight.removeAll()
        owed.removeAll()  // the connection that owed them is gone
        for id in lost.keys { disarmDeadline(id) }
        for id in Array(hostCalls.keys) { cancelHostCalls(id) }
        pids.withLock { $0.removeAll() }
        for request in lost.values { request.deliver(.interrupted(reason)) }
        let waiters = statusWaiters
        statusWaiters.removeAll()
        for waiter in waiters.values {
            loop.cancelTimer(waiter.timer)
            waiter.answer(nil)
        }
        let prewarms = prewarmWaiters
        prewarmWaiters.removeAll()
        for waiter in prewarms.values { waiter(.failure(.interrupted(reason))) }
    }

    private func failQueued(_ reason: InterruptionReason) {
        let lost = queued
        queued.removeAll()
        for (request, _) in lost {
            disarmDeadline(request.id)
            request.deliver(.interrupted(reason))
        }
    }

    private func failAll(_ reason: InterruptionReason) {
        failInFlight(reason)
        failQueued(reason)
        let waiters = readyWaiters
        readyWaiters = []
        for waiter in waiters { waiter(.failure(HostError(.daemonUnavailable, "the client was shut down"))) }
    }

    /// Requests that waited `reconnectTimeout` for a connection are interrupted, so none waits forever. One timer
    /// at a time, whatever empties and fills the queue meanwhile.
    private func scheduleQueueExpiry() {
        guard queueExpiryTimer == nil else { return }
        queueExpiryTimer = loop.schedule(afterNanoseconds: nanoseconds(reconnectTimeout / 4)) { [unowned self] in
            self.queueExpiryTimer = nil
            let now = monotonicNanoseconds()
            let limit = nanoseconds(self.reconnectTimeout)
            let expired = self.queued.filter { now - $0.since >= limit }
            self.queued.removeAll { now - $0.since >= limit }
            for (request, _) in expired {
                self.disarmDeadline(request.id)
                request.deliver(.interrupted(.disconnected))
            }
            if !self.queued.isEmpty { self.scheduleQueueExpiry() }
        }
    }

    /// To the app's `logHandler`, on the client's loop thread; never to stderr unless the app asks
    /// (`HostConfiguration.standardErrorLog`, which does not block).
    private func writeLog(_ message: String) {
        logHandler?(.warning, "client: " + message.displaySafe())
    }
}

extension ExtensionHost {
    /// Connects to an `sdk-host serve` daemon. The returned host has the same API as an embedded one; if the
    /// daemon goes away, in-flight requests are interrupted (`disconnected`) and the next request reconnects.
    ///
    /// - Parameters:
    ///   - socketPath: The daemon's socket.
    ///   - reconnectTimeout: Seconds a request waits for a connection (and `connect` for the daemon's answer)
    ///     before it is interrupted; and `status()` for the daemon's report before it returns nil.
    ///   - heartbeatTimeout: Seconds the daemon may leave a ping unanswered while a request, a status or a prewarm
    ///     waits on it (the client pings it then, four times as often) before the client gives the connection up
    ///     as dead (a stopped or wedged daemon): its requests are interrupted (`disconnected`) and the next one
    ///     connects again.
    ///   - daemonUID: The uid the daemon must run as (checked with SO_PEERCRED at every connect); nil accepts this
    ///     process's own uid or root. The socket's folder must also belong to you or root and not be writable by
    ///     others.
    ///   - appName: This app's name, sent to the daemon: requests of one app (this uid and name) share workers
    ///     that no other app's requests reach (`WorkerSharing` perApp). Default: the executable's file name.
    ///   - logHandler: Where the client's warnings go (an error the daemon sent, a reply for a request it no
    ///     longer has); nil, the default, logs nothing. `HostConfiguration.standardErrorLog` writes them to stderr.
    /// - Throws: `HostError.Code.daemonUnavailable` if the daemon cannot be reached, refuses this user, cannot be
    ///   trusted (its folder or its uid), or does not answer.
    public static func connect(socketPath: String, reconnectTimeout: Double = 5, heartbeatTimeout: Double = 30,
                               daemonUID: uid_t? = nil, appName: String? = nil,
                               logHandler: (@Sendable (LogLevel, String) -> Void)? = nil)
        async throws(HostError) -> ExtensionHost
    {
        let client = try DaemonClient(socketPath: socketPath, reconnectTimeout: reconnectTimeout,
                                      heartbeatTimeout: heartbeatTimeout, daemonUID: daemonUID, appName: appName,
                                      logHandler: logHandler)
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<Void, HostError>, Never>) in
            client.waitUntilReady { continuation.resume(returning: $0) }
        }
        if case .failure(let error) = result {
            client.shutdown {}
            throw error
        }
        return ExtensionHost(backend: client)
    }

    /// The daemon's status report (daemon mode only); nil if the daemon cannot be reached.
    package func daemonStatus() async -> PlistValue? {
        guard let client = backend as? DaemonClient else { return nil }
        return await withCheckedContinuation { continuation in client.report { continuation.resume(returning: $0) } }
    }
}

/// Why a daemon socket's folder cannot be trusted by this process: a user other than this process's and root owns
/// it, or its group or others may write it (either could put their own socket there). One rule for both ends: a
/// client checks it before it connects, the daemon before it listens (it served from a folder every client refused).
package enum SocketFolderProblem: Equatable {
    case ownedBy(uid_t)
    /// The folder's permission bits.
    case writableByOthers(mode_t)

    package init?(_ folder: stat) {
        if folder.st_uid != getuid() && folder.st_uid != 0 {
            self = .ownedBy(folder.st_uid)
        } else if folder.st_mode & 0o022 != 0 {
            self = .writableByOthers(folder.st_mode & 0o777)
        } else {
            return nil
        }
    }
}

extension HostError {
    /// An error from a `connected` message's `problems` entry, "<code> <detail>" (a code this client does not know
    /// reads as `refused`, with the whole text as its detail).
    init(daemonProblem text: String) {
        if let space = text.firstIndex(of: " "), let code = HostError.Code(name: text[..<space]) {
            self.init(code, String(text[text.index(after: space)...]))
        } else {
            self.init(.refused, text)
        }
    }
}
