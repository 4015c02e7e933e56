// DaemonServer's clients once connected: the messages a client may send, its requests (each charged to the
// client and to the daemon until it ends, its begin forwarded to a worker as the client wrote it), and the
// session's end. Accepting, sweeping and draining are in DaemonServer.swift.

import SDKWire
import SDKHost
import SDKPosix

#if canImport(Glibc)
import Glibc
#endif

extension DaemonServer {
    func handle(_ message: Message, from session: ClientSession) {
        if !session.handshaken {
            guard case .connect = message else {
                session.send(.error(message: "send 'connect' first", id: nil))
                // The type as the client wrote it (escaped by the log): an unknown one is named, not just "unknown".
                let type = message.plist["type"]?.stringValue ?? message.typeName
                return closeSession(session, reason: "'\(type.prefix(64))' before 'connect'")
            }
        }
        switch message {
        case .connect(let version, let app):
            guard !session.handshaken else {
                session.send(.error(message: "'connect' sent twice", id: nil))
                return closeSession(session, reason: "'connect' sent twice")
            }
            session.handshaken = true
            guard version == protocolVersion else {
                session.send(.error(message: "protocol \(version) is not supported; this daemon speaks \(protocolVersion)", id: nil))
                return closeSession(session, reason: "protocol version \(version)")
            }
            // The app is the peer's uid (from the kernel) and the name it gives; a name is only a label within
            // its own uid, so no client can join another user's workers by naming itself after them.
            session.app = "\(session.credentials.uid)/" + Self.appLabel(app)
            session.send(connectedMessage(for: session))
        case .begin(let clientID, let items, let extensionID, let deadlineMs):
            let forwarded = session.connection.withForwardablePayload { $0.flatMap(ForwardedFrame.init(payload:)) }
            begin(session, clientID: clientID, items: items, extensionID: extensionID, deadlineMs: deadlineMs,
                  forwarded: forwarded)
        case .prewarm(let id, let extensionID):
            engine.prewarmOnLoop(extensionID, app: session.app) { [session] result in
                switch result {
                case .success(let pid): session.send(.prewarmed(id: id, pid: pid))
                case .failure(.interrupted(let reason)): session.send(.interrupted(id: id, reason: reason.plist))
                case .failure(.cancelled): session.send(.interrupted(id: id, reason: InterruptionReason.hostShutdown.plist))
                }
            }
        case .cancel(let clientID):
            if let internalID = session.internalIDs[clientID] { engine.cancelOnLoop(internalID) }
        case .credit(let clientID, let count):
            if let internalID = session.internalIDs[clientID] { engine.creditOnLoop(internalID, Int(clamping: count)) }
        case .status(let seq):
            session.send(.statusReport(seq: seq, report: engine.statusOnLoop().visible(to: session).plist))
        case .subscribe:
            session.subscribed = true
        case .ping(let seq):
            session.send(.pong(seq: seq))
        case .hostCallResult(let clientID, let call, _), .hostCallError(let clientID, let call, _):
            // The app answered a host call: to the engine, which sends it to the worker if it still waits. An
            // answer to a call this client was not asked, or no longer is, crossed a cancel: dropped.
            guard let pending = session.calls[call], pending.clientID == clientID else { return }
            session.calls[call] = nil
            switch message {
            case .hostCallResult(_, _, let items): pending.done(.success(items))
            case .hostCallError(_, _, let error): pending.done(.failure(error))
            default: break
            }
        case .pong, .unknown:
            break
        default:
            session.send(.error(message: "a client may not send '\(message.plist["type"]?.stringValue ?? "?")'", id: nil))
            closeSession(session, reason: "unexpected message")
        }
    }

    /// A client's `begin`, decoded or (with `items` empty) scanned: `forwarded` is its payload to send on as it
    /// is, which a scanned one always has.
    func begin(_ session: ClientSession, clientID: RequestID, items: [ExtensionItem], extensionID: String?,
                       deadlineMs: Int64?, forwarded: ForwardedFrame?)
    {
        guard let extensionID else {
            session.send(.error(message: "begin without 'extension'", id: clientID))
            return closeSession(session, reason: "begin without 'extension'")
        }
        guard session.internalIDs[clientID] == nil else {
            session.send(.error(message: "request id \(clientID) is already in flight", id: clientID))
            return closeSession(session, reason: "duplicate request id")
        }
        if draining {
            session.send(.interrupted(id: clientID, reason: InterruptionReason.hostShutdown.plist))
            return
        }
        // What this request holds until it ends, charged to the client and to the daemon: a forwarded begin's
        // payload (it goes on as that, with no descriptors: its decoded items, if it was decoded, are not kept; a
        // 2 MiB begin may decode to 64 times that), or what a decoded one was charged as decoded.
        let items = forwarded == nil ? items : []
        let bytes = forwarded?.payload.count ?? session.connection.currentFrameBytes
        let descriptors = items.reduce(0) { $0 + $1.fileAttachments.count }
        guard bytes <= configuration.pendingRequestBytesPerClient else {
            // Not `overloaded`, which says to try again: this begin never fits.
            session.send(.interrupted(id: clientID, reason: InterruptionReason.protocolViolation(
                "the begin holds \(bytes) bytes decoded; a client's requests may hold \(configuration.pendingRequestBytesPerClient)").plist))
            return
        }
        if session.internalIDs.count >= configuration.maxInFlightRequests
            || session.pendingBytes + bytes > configuration.pendingRequestBytesPerClient
            || pendingRequestBytes + bytes > configuration.pendingRequestBytesTotal
            || session.pendingDescriptors + descriptors > configuration.maxDescriptorsPerClient
            || pendingDescriptors + descriptors > configuration.maxDescriptorsTotal
        {
            engine.log(.debug, "client pid \(session.credentials.pid): request \(clientID) overloaded "
                + "(\(session.internalIDs.count) in flight, \(session.pendingBytes) bytes and "
                + "\(session.pendingDescriptors) descriptors held)")
            session.overloads += 1
            // Its descriptors close as `items` goes out of scope.
            session.send(.interrupted(id: clientID, reason: InterruptionReason.overloaded.plist))
            return
        }
        session.pendingBytes += bytes
        pendingRequestBytes += bytes
        session.pendingDescriptors += descriptors
        pendingDescriptors += descriptors
        // The worker's id for it: the client's own, so that the workers' logs, crash and leak reports name the id the
        // client knows (they named another), unless the engine has that id in use (another client's request, or
        // one a worker still runs): then a fresh one (distinct is enough, and needs no getrandom).
        let internalID = engine.isInUse(clientID) ? makeRequestID() : clientID
        session.internalIDs[clientID] = internalID
        // Clamped: a peer's deadline is any Int64; negative is "now", huge is the host's maximum.
        let deadline = deadlineMs.map { Double(min(max($0, 0), Int64(maximumSeconds) * 1000)) / 1000 }
        // Called on the loop thread by the engine, exactly once: `forwarded` is the worker's completion payload
        // and its id's range when it can be sent on as it is.
        let ended: @Sendable (RequestOutcome, (UnsafeRawBufferPointer, Range<Int>)?) -> Void = { [unowned self, session] outcome, forwarded in
            session.pendingBytes -= bytes
            self.pendingRequestBytes -= bytes
            session.pendingDescriptors -= descriptors
            self.pendingDescriptors -= descriptors
            session.internalIDs.removeValue(forKey: clientID)
            switch outcome {
            case .completed(let items):
                if let (payload, idRange) = forwarded {
                    session.sendForwarded(payload, id: clientID, idRange: idRange)
                } else {
                    session.send(.complete(id: clientID, items: items))
                }
            case .cancelled(let error): session.send(.cancelled(id: clientID, error: error))
            case .interrupted(let reason): session.send(.interrupted(id: clientID, reason: reason.plist))
            }
        }
        var request = SubmittedRequest(
            id: internalID, extensionID: extensionID, items: items,
            deadline: deadline,
            onWorkerAssigned: { [session] pid in session.send(.assigned(id: clientID, pid: pid)) },
            deliver: { outcome in ended(outcome, nil) },
            // Partial results go to the client as they come; the client's `credit` lets the worker send more.
            progress: { [session] items in session.send(.partial(id: clientID, items: items)) },
            app: session.app)
        request.deliverForwarded = { outcome, payload, idRange in ended(outcome, (payload, idRange)) }
        // Its worker's host calls go to this client, which runs the app's services; the daemon runs no app code.
        request.services = ClientServiceLink(session: session, clientID: clientID)
        request.forwardedBegin = forwarded
        request.publishesPid = false
        engine.start(request)
    }

    func sessionEnded(_ session: ClientSession, _ end: ConnectionEnd) {
        switch end {
        case .badInput(let detail), .truncated(let detail):
            engine.log(.warning, "client uid \(session.credentials.uid) pid \(session.credentials.pid) sent bad input "
                + "(\(detail)); dropped that client only")
        case .broken(let detail), .notReading(let detail):
            engine.log(.warning, "client uid \(session.credentials.uid) pid \(session.credentials.pid) dropped: \(detail)")
        case .endOfFile:
            break
        }
        closeSession(session, reason: nil)
    }

    /// Closes a client and cancels its in-flight requests at the workers.
    /// Past MaxClientOutputBytesTotal: disconnects the clients that have taken none of their replies for
    /// PartialFrameTimeoutSeconds (`FramedConnection.outputWaitingSince`), the one holding the most first, until
    /// the total is under it; then, if it is still over, stops reading each client that holds more than its share
    /// of it (the total over the clients with replies waiting), so that it can begin nothing more, until it holds
    /// under half its share or the total is back under three quarters (`resumeReadingClients`). Reading slowly
    /// enough to stay under its own MaxClientOutputBytes, each of many clients could otherwise hold that much; a
    /// client held back waits on its own reading only, not on the others'.
    func shedOutput() {
        guard outputBudget.used > outputBudget.limit else { return }
        let now = engine.loop.now
        let idle = UInt64(configuration.partialFrameTimeout * 1e9)
        let stuck = sessions.values.filter { s in s.connection.outputWaitingSince.map { now &- $0 >= idle } ?? false }
            .sorted { ($0.connection.pendingOutputBytes, $1.number) > ($1.connection.pendingOutputBytes, $0.number) }
        for session in stuck where outputBudget.used > outputBudget.limit {
            closeSession(session, reason: "\(session.connection.pendingOutputBytes) bytes of replies unread, none taken for "
                + "\(tenths(now &- (session.connection.outputWaitingSince ?? now))) s, while the replies of all clients "
                + "passed MaxClientOutputBytesTotal (\(outputBudget.limit) bytes)")
        }
        guard outputBudget.used > outputBudget.limit else { return }
        let waiting = sessions.values.filter { $0.connection.pendingOutputBytes > 0 }
        let share = outputBudget.limit / max(1, waiting.count)
        var held = 0
        for session in waiting where session.connection.pendingOutputBytes > share && !session.connection.isPausedForBudget {
            session.connection.pauseForBudget(resumeBelow: share / 2)
            held += 1
        }
        guard held > 0 else { return }
        clientsHeldBack += 1
        if clientsHeldBack == 1 || clientsHeldBack % 100 == 0 {
            engine.log(.warning, "the replies of all clients passed MaxClientOutputBytesTotal (\(outputBudget.used) of "
                + "\(outputBudget.limit) bytes): \(held) client(s) holding more than a share of it (\(share) bytes) are "
                + "not read until they hold under half that (\(clientsHeldBack) time(s) so far)")
        }
    }

    /// Reads the clients `shedOutput` held back again.
    func resumeReadingClients() {
        for session in sessions.values { session.connection.resumeFromBudget() }
    }

    func closeSession(_ session: ClientSession, reason: String?) {
        guard sessions.removeValue(forKey: session.number) != nil else { return }
        if let reason { engine.log(.warning, "closing client pid \(session.credentials.pid): \(reason)") }
        session.connection.close()
        // Host calls waiting for this app fail (the engine sends each worker the error at once, on this turn), then
        // its requests end `disconnected`.
        let calls = session.calls
        session.calls.removeAll()
        for (_, pending) in calls.sorted(by: { $0.key < $1.key }) { pending.done(.failure(.appGone)) }
        let orphans = Array(session.internalIDs.values)
        session.internalIDs.removeAll()
        for id in orphans { engine.endOnLoop(id, .interrupted(.disconnected)) }
        // The app's last connection: its workers go now, not after the idle timeout.
        if let app = session.app, !sessions.values.contains(where: { $0.app == app }) { engine.appLeft(app) }
    }

    /// A client's app name as a label: at most 64 bytes of printable ASCII (others become "_"); "app" if none.
    static func appLabel(_ name: String?) -> String {
        let bytes = Array((name ?? "").utf8.prefix(64)).map { $0 >= 0x21 && $0 < 0x7F && $0 != UInt8(ascii: "/") ? $0 : UInt8(ascii: "_") }
        return bytes.isEmpty ? "app" : String(decoding: bytes, as: UTF8.self)
    }
}

extension HostStatus {
    /// What `session` may see: another uid's app names, worker pids, crash and leak reports are left out. Root and
    /// the daemon's own uid (its operator) see everything; shared pools (no app) are everyone's.
    func visible(to session: ClientSession) -> HostStatus {
        guard !session.seesEverything else { return self }
        var copy = self
        copy.extensions = extensions.map { e in
            var e = e
            e.pools = e.pools.filter { session.maySee(app: $0.app) }
            e.workers = e.workers.filter { session.maySee(app: $0.app) }
            // The operator's paths stay the operator's (as in `connected`).
            if e.problem != nil { e.problem = DaemonServer.refusedBriefly(e.identifier) }
            return e
        }
        copy.recentCrashes = recentCrashes.filter { session.maySee(app: $0.app) }
        copy.recentLeaks = recentLeaks.filter { session.maySee(app: $0.app) }
        return copy
    }
}

/// One connected client. `@unchecked Sendable`: used only on the engine's loop thread (the closures that
/// capture it are called there).
final class ClientSession: @unchecked Sendable {
    // Stored properties `@exclusivity(unchecked)` but for `calls`, which holds the engine's closures: plain data
    // on the loop thread, no access to which calls out. The simulation's per-step checks read `internalIDs` of
    // every session (`clientRequestCount`, `largestClientInFlight`).
    let connection: FramedConnection
    let credentials: PeerCredentials
    /// Its key in `DaemonServer.sessions`, set when admitted.
    @exclusivity(unchecked) var number = 0
    let connectedAt: UInt64
    @exclusivity(unchecked) var handshaken = false
    /// Whether the client asked for worker events (`subscribe`).
    @exclusivity(unchecked) var subscribed = false
    /// "uid/name": the pool of workers this client's requests go to (`WorkerSharing` perApp).
    @exclusivity(unchecked) var app: String?
    /// The client's request id → the engine's.
    @exclusivity(unchecked) var internalIDs: [RequestID: RequestID] = [:]
    /// Frame bytes of this client's requests that have not ended.
    @exclusivity(unchecked) var pendingBytes = 0
    /// Descriptor attachments of this client's requests that have not ended.
    @exclusivity(unchecked) var pendingDescriptors = 0
    @exclusivity(unchecked) var overloads = 0
    /// Host calls sent to this client and not answered, by the daemon's number for them.
    var calls: [Int64: (clientID: RequestID, done: @Sendable (Result<[ExtensionItem], ExtensionError>) -> Void)] = [:]
    @exclusivity(unchecked) var lastCall: Int64 = 0

    init(connection: FramedConnection, credentials: PeerCredentials, connectedAt: UInt64) {
        self.connection = connection
        self.credentials = credentials
        self.connectedAt = connectedAt
    }

    func send(_ message: Message) {
        try? connection.send(message)
    }

    /// Root and the daemon's own uid see every app's workers, events and reports.
    var seesEverything: Bool { credentials.uid == 0 || credentials.uid == getuid() }

    /// Whether this client may see what belongs to `app` ("uid/name"; nil for a shared pool).
    func maySee(app: String?) -> Bool {
        guard let app, !seesEverything else { return true }
        return app.hasPrefix("\(credentials.uid)/")
    }

    /// Sends a worker's payload on as it is, with the client's request id.
    func sendForwarded(_ payload: UnsafeRawBufferPointer, id: RequestID, idRange: Range<Int>) {
        try? connection.sendForwarded(payload, id: id, idRange: idRange)
    }
}

/// A client request's host services: each call goes to the client that owns the request, under a number of the
/// daemon's for that client, and comes back through `handle`. `@unchecked Sendable`: used on the engine's loop
/// thread only (the engine starts and cancels calls there). It holds its session for as long as the request holds
/// it (a client that goes abandons its requests): not weakly, as a weak reference would slow every retain and
/// release of the session for its whole life; a gone client's session is closed, and answers `appGone`.
final class ClientServiceLink: HostServiceProvider, @unchecked Sendable {
    private let session: ClientSession
    private let clientID: RequestID

    init(session: ClientSession, clientID: RequestID) {
        self.session = session
        self.clientID = clientID
    }

    func start(_ call: HostServiceCall, done: @escaping @Sendable (Result<[ExtensionItem], ExtensionError>) -> Void)
        -> @Sendable () -> Void
    {
        guard session.connection.isOpen else {
            done(.failure(.appGone))
            return {}
        }
        session.lastCall += 1
        let number = session.lastCall
        do {
            try session.connection.send(.hostCall(id: clientID, call: number, service: call.service, items: call.items))
        } catch {
            done(.failure(.callNotForwarded(error.detail)))
            return {}
        }
        session.calls[number] = (clientID, done)
        let clientID = clientID, session = session
        return {
            guard session.calls.removeValue(forKey: number) != nil else { return }
            session.send(.hostCallCancel(id: clientID, call: number))
        }
    }
}
