// DaemonServer: the host engine behind a Unix socket. The listener, every client session and the engine share
// the engine's one event loop. Each client's request ids are mapped to fresh internal ids, so clients can
// neither collide nor cancel each other's requests. A client that disconnects has its requests cancelled at the
// workers. SIGTERM/SIGINT: stop accepting, let in-flight requests finish up to the drain timeout, interrupt the
// rest, stop the workers, remove the socket.
//
// Every client is a potential attacker, so everything it can make the daemon hold is bounded: connections
// (MaxClients, and MaxClientsPerUID; at either limit the oldest connection still in its handshake makes room),
// requests in flight per client (MaxInFlightRequests) and the bytes they carry (per client and in
// total), half-received frames (a shared input budget, and PartialFrameTimeoutSeconds to finish one), unread
// replies (MaxClientOutputBytes: past it the client is no longer read; past it plus a frame, or still stuck
// after the timeout, it is disconnected; and MaxClientOutputBytesTotal across clients: past it, the clients that
// took none of theirs for the timeout are disconnected, the largest first, and one holding more than its share is
// not read until it holds under half of it), and the time to say `connect` (HandshakeTimeoutSeconds). At the
// descriptor limit the listener backs off instead of spinning on a readable socket it cannot accept from.

import SDKWire
import Dispatch
import SDKHost
import SDKPosix
import Synchronization
import CSDKShim

#if canImport(Glibc)
import Glibc
#endif

package final class DaemonServer: @unchecked Sendable {
    // @unchecked Sendable: everything below `engine` is touched only on the engine's loop thread.
    let configuration: DaemonConfiguration
    package let engine: HostEngine
    private var listener: FileDescriptor?
    private var signals: FileDescriptor?
    /// Connected clients by their session number (increasing: walking them is the same on every run, which the
    /// simulation's replay needs; heap addresses are not).
    var sessions: [Int: ClientSession] = [:]
    private var sessionsAdmitted = 0
    /// Makes the id a client's request has towards the workers: distinct is enough (`RequestID.distinct`). The
    /// simulation makes them from its seed.
    package var makeRequestID: () -> RequestID = { RequestID.distinct() }
    private(set) var draining = false
    /// Its engine has stopped (loop thread; the simulation reads it).
    package private(set) var stopped = false
    private let finished = DispatchSemaphore(value: 0)
    private let inputBudget: InputBudget
    /// Unread replies of all clients (MaxClientOutputBytesTotal; `shedOutput`).
    let outputBudget: OutputBudget
    /// Frame bytes and descriptors of all clients' requests that have not ended (DaemonServer+Sessions).
    var pendingRequestBytes = 0
    var pendingDescriptors = 0
    private var acceptBackoff = 0.0
    private var acceptBackoffTimer: TimerID?
    private var refusedWhileFull = 0
    /// How many times clients were held back for MaxClientOutputBytesTotal (`shedOutput`), for its log line.
    var clientsHeldBack = 0
    private var evictedInHandshake = 0
    /// The socket's path: the configured one, or the one systemd bound (socket activation).
    package let socketPath: String
    /// Whether the listener came from systemd: then systemd owns the path and it is not removed at stop.
    package let socketActivated: Bool
    private var watchdogTimer: TimerID?
    /// When the last reload ended and what it took, and the timer of one a SIGHUP asked for too soon after it
    /// (`reload`).
    private var lastReload: (endedAt: UInt64, took: UInt64)?
    private var reloadTimer: TimerID?
    /// The extension list the clients were last sent (`connected`), made at the start and at each reload: in full
    /// for the daemon's own uid and root, and without the refusals' detail for the others (`ClientSession.seesEverything`).
    /// A reload sends it again only if it changed.
    private var announcedExtensions: (full: Message, limited: Message)?

    /// The `connected` message for `session`.
    func connectedMessage(for session: ClientSession) -> Message {
        let announced = announcedExtensions ?? connectedMessages()
        return session.seesEverything ? announced.full : announced.limited
    }

    /// Blocks SIGTERM/SIGINT (call before any other thread starts), discovers extensions and binds the socket.
    ///
    /// - Throws: `HostError` for a bad configuration (a bad manifest is skipped and logged), or a socket that is in
    ///   use or cannot be bound.
    package init(configuration: DaemonConfiguration) throws(HostError) {
        var configuration = configuration
        if configuration.host.logHandler == nil {
            configuration.host.logHandler = Systemd.stderrIsJournal() ? Systemd.journalLogHandler() : HostConfiguration.standardErrorLog
        }
        let descriptorNote = Self.fitUnreadDescriptorLimit(&configuration)
        // Frames of up to 16 MiB come and go by the thousand (a client's 1 MiB begins, their replies): glibc
        // raises its mmap threshold to the largest block freed, and serves them from the loop thread's arena
        // after that, which keeps what it frees. With the output budget and compacted buffers, twenty clients that
        // never read still took the daemon to 570 MB (253 MB of arena for 70 MB in use; 133 MB kept after they
        // left); with the threshold fixed at 256 KiB, ~390 MB, and 11 MB after.
        _ = sdk_fix_mmap_threshold(256 << 10)
        let inherited = try Systemd.inheritedListener()
        socketActivated = inherited != nil
        socketPath = inherited.flatMap(boundSocketPath) ?? configuration.socketPath
        self.configuration = configuration
        inputBudget = InputBudget(limit: configuration.inputBudgetBytes)
        outputBudget = OutputBudget(limit: configuration.maxClientOutputBytesTotal)
        let signals: FileDescriptor
        do {
            signals = try terminationSignalDescriptor()
        } catch {
            throw HostError(.system, "cannot watch SIGTERM/SIGINT: \(error)")
        }
        do throws(HostError) {
            engine = try Self.makeEngine(configuration)
        } catch {
            signals.close()
            if let inherited { close(inherited) }
            throw error
        }
        self.signals = consume signals
        watchOutputBudget()
        if let descriptorNote { engine.log(.warning, descriptorNote) }
        Self.startDispatchWorker()
        if let inherited {
            listener = FileDescriptor(adopting: inherited)
            return
        }
        do throws(HostError) {
            try configuration.prepareSocketDirectory()
            listener = try Self.bind(configuration.socketPath, mode: configuration.socketMode, log: engine)
        } catch {
            let engine = self.engine
            let signals = self.signals.take()
            engine.shutdown {}
            signals?.close()
            throw error
        }
    }

    /// A daemon for the simulation (SDKSimulation): no socket, no signals; its engine's loop is driven by the
    /// caller, and clients come in through `admit`. `startSimulated` starts it, `stopSimulated` drains and stops it.
    package init(simulating configuration: DaemonConfiguration) throws(HostError) {
        socketActivated = false
        socketPath = configuration.socketPath
        self.configuration = configuration
        inputBudget = InputBudget(limit: configuration.inputBudgetBytes)
        outputBudget = OutputBudget(limit: configuration.maxClientOutputBytesTotal)
        engine = try Self.makeEngine(configuration)
        watchOutputBudget()
    }

    /// The daemon's engine: completions go to clients as the workers wrote them (`forwardsPayloads`).
    private static func makeEngine(_ configuration: DaemonConfiguration) throws(HostError) -> HostEngine {
        var host = configuration.host
        host.forwardsPayloads = true
        return try HostEngine(configuration: host)
    }

    /// Starts serving clients admitted with `admit` (loop's turn).
    package func startSimulated() {
        startServing()
    }

    /// As SIGTERM would: drains, then stops (loop's turn); the engine's shutdown completes as it would.
    package func stopSimulated() {
        beginDrain(0)
    }

    /// Clients connected now.
    package var sessionCount: Int { sessions.count }
    /// The most requests one connected client has in flight.
    package var largestClientInFlight: Int {
        var largest = 0
        for session in sessions.values { largest = max(largest, session.internalIDs.count) }
        return largest
    }
    /// Requests of connected clients that have not ended.
    package var clientRequestCount: Int {
        var count = 0
        for session in sessions.values { count += session.internalIDs.count }
        return count
    }
    /// Bytes and descriptors all clients' requests hold (0 once every request has ended).
    package var heldByClientRequests: (bytes: Int, descriptors: Int) { (pendingRequestBytes, pendingDescriptors) }

    /// Past MaxClientOutputBytesTotal, clients are shed and held back; back under it, read again.
    private func watchOutputBudget() {
        outputBudget.onOver = { [unowned self] in self.shedOutput() }
        outputBudget.onUnder = { [unowned self] in self.resumeReadingClients() }
    }

    /// Raises the soft limit on open descriptors to the hard one (as daemons do: the unit file's LimitNOFILE, a
    /// shell's 1024 otherwise), and keeps `MaxUnreadDescriptorsPerClient` within an eighth of it. The kernel refuses
    /// every descriptor this user sends (ETOOMANYREFS) once more than that soft limit are in flight unread, so a
    /// client that never reads could otherwise make the daemon fail every other client's descriptor passing.
    /// Returns a line to log when the configured limit was lowered.
    static func fitUnreadDescriptorLimit(_ configuration: inout DaemonConfiguration) -> String? {
        var limit = rlimit()
        guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return nil }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        let share = Int(clamping: min(limit.rlim_cur, rlim_t(Int.max)) / 8)
        let fitted = max(64, share)
        guard configuration.maxUnreadDescriptorsPerClient > fitted else { return nil }
        let note = "MaxUnreadDescriptorsPerClient \(configuration.maxUnreadDescriptorsPerClient) lowered to \(fitted): an "
            + "eighth of this process's descriptor limit (\(limit.rlim_cur)), past which the kernel refuses descriptors "
            + "this user sends; raise LimitNOFILE (ulimit -n) to keep it"
        configuration.maxUnreadDescriptorsPerClient = fitted
        return note
    }

    /// Binds `path`, replacing a stale socket left by a dead daemon but never a live one.
    static func bind(_ path: String, mode: mode_t, log: HostEngine) throws(HostError) -> FileDescriptor {
        // However the path was given (SocketPath, --socket, the runtime folder), one no socket can have is the
        // operator's to fix.
        if let problem = DaemonConfiguration.socketPathProblem(path) { throw HostError(.invalidConfiguration, "socket path \(problem)") }
        var st = stat()
        if lstat(path, &st) == 0 {
            guard (st.st_mode & S_IFMT) == S_IFSOCK else {
                throw HostError(.invalidConfiguration, "\(path) exists and is not a socket; refusing to replace it")
            }
            do {
                let probe = try connectUnix(path: path)
                probe.close()
                throw HostError(.system, "another sdk-host daemon is already listening on \(path)")
            } catch let error as SystemError where error.errno == ECONNREFUSED {
                log.log(.info, "removing stale socket \(path) left by a daemon that is gone")
                unlink(path)
            } catch let error as HostError {
                throw error
            } catch {
                throw HostError(.invalidConfiguration, "cannot check existing socket \(path): \(error)")
            }
        }
        let fd: FileDescriptor
        do {
            fd = try listenUnix(path: path)
        } catch {
            throw HostError(.system, "cannot listen on \(path): \(error)")
        }
        chmod(path, mode)
        return fd
    }

    /// libdispatch makes its own epoll and eventfd descriptors when its first worker thread starts, and traps
    /// if it cannot. The engine's first use of a global queue comes whenever that thread is scheduled, which on
    /// a loaded machine was after clients had taken the descriptor limit: the daemon died of SIGILL. One worker
    /// started and waited for here makes those descriptors before any client can be accepted.
    private static func startDispatchWorker() {
        let started = DispatchSemaphore(value: 0)
        DispatchQueue.global(qos: .utility).async { started.signal() }
        started.wait()
    }

    /// Serves until SIGTERM or SIGINT, then drains and stops. Blocks the calling (main) thread; returns 0.
    package func run() -> Int32 {
        engine.loop.execute { self.startOnLoop() }
        finished.wait()
        return 0
    }

    private func startOnLoop() {
        guard let listenFD = listener?.rawValue, let signalFD = signals?.rawValue else { return }
        do {
            try engine.loop.register(listenFD, events: EventLoop.readable) { [unowned self] _ in self.acceptClients() }
            try engine.loop.register(signalFD, events: EventLoop.readable) { [unowned self] _ in
                while let signal = readSignal(signalFD) {
                    if signal == SIGHUP { self.reloadSoon() } else { self.beginDrain(signal) }
                }
            }
        } catch {
            engine.log(.error, "cannot watch the listening socket: \(error)")
            beginDrain(0)
            return
        }
        startServing()
        engine.log(.info, "serving \(engine.manifestIdentifiers.joined(separator: ", ")) on \(socketPath) "
            + "(pid \(getpid()), uids \(configuration.allowedUIDs.map(String.init).joined(separator: ","))"
            + (socketActivated ? ", socket from systemd" : "") + ")")
        Systemd.notify("READY=1\nMAINPID=\(getpid())\nSTATUS=\(statusLine)")
        if let interval = Systemd.watchdogPingInterval() { pingWatchdog(every: interval) }
    }

    /// What serving needs besides the listener and the signals: the sweep and the event fan-out.
    private func startServing() {
        scheduleSweep()
        announcedExtensions = connectedMessages()
        engine.eventObserver = { [unowned self] event in
            // Made for the first session that takes it: with no subscriber, an event costs no message.
            var message: Message?
            for session in self.sessions.values where session.subscribed && session.maySee(app: event.app) {
                if message == nil { message = .event(event.plist) }
                session.send(message!)
            }
        }
    }

    /// The one-line STATUS= for systemctl status.
    private var statusLine: String {
        "serving \(engine.manifestIdentifiers.count) extension(s) on \(socketPath); \(sessions.count) client(s)"
    }

    /// WATCHDOG=1 from the loop itself: if the loop is stuck, the pings stop and systemd restarts the daemon.
    private func pingWatchdog(every interval: UInt64) {
        Systemd.notify("WATCHDOG=1")
        watchdogTimer = engine.loop.schedule(afterNanoseconds: interval) { [unowned self] in
            self.watchdogTimer = nil
            if !self.draining { self.pingWatchdog(every: interval) }
        }
    }

    // MARK: Reload (SIGHUP)

    /// A SIGHUP: reloads now, or, within a second of the last reload's end (or within as long as it took, if
    /// longer), once when that has passed. SIGHUPs faster than reloads take (thousands of manifests) would
    /// otherwise keep the loop reloading, with every client waiting; those that come meanwhile are one reload.
    private func reloadSoon() {
        guard !draining, reloadTimer == nil else { return }
        let now = engine.loop.now
        let earliest = lastReload.map { $0.endedAt &+ max(1_000_000_000, $0.took) } ?? now
        guard now < earliest else { return reload() }
        reloadTimer = engine.loop.schedule(afterNanoseconds: earliest &- now) { [unowned self] in
            self.reloadTimer = nil
            self.reload()
        }
    }

    /// Rescans the manifests: new workers use the new ones, running workers finish what they have and retire.
    /// Clients are sent the new extension list if it changed. A bad manifest is skipped and logged; a search path
    /// that cannot be read keeps the old set (and says so in the log).
    private func reload() {
        guard !draining else { return }
        let start = monotonicNanoseconds()
        Systemd.notify("RELOADING=1\nMONOTONIC_USEC=\(start / 1000)")
        if case .success = engine.reloadManifestsOnLoop() {
            let messages = connectedMessages()
            if messages.full != announcedExtensions?.full {
                announcedExtensions = messages
                for session in sessions.values where session.handshaken {
                    session.send(session.seesEverything ? messages.full : messages.limited)
                }
            }
        }
        Systemd.notify("READY=1\nSTATUS=\(statusLine)")
        let end = monotonicNanoseconds()
        lastReload = (engine.loop.now, end &- start)
    }

    /// The `connected` message, in full and for clients of other uids (`announcedExtensions`).
    func connectedMessages() -> (full: Message, limited: Message) {
        let infos = engine.extensions
        // The listed extensions an embedded host would refuse by name (a skipped manifest, a missing executable):
        // the client refuses them as it would, rather than sending a request that can only fail to launch.
        var full: [String: String] = [:], limited: [String: String] = [:]
        var total = 0
        for info in infos {
            guard let problem = engine.lookupProblem(info.identifier) else { continue }
            // The detail names the operator's files and folders: other uids get what it is, not where.
            let brief = "\(problem.code) \(Self.refusedBriefly(info.identifier))"
            limited[info.identifier] = brief
            // At most 1,024 scalars each and 64 KiB in all: a manifest's error can quote its value, and every client
            // is sent the list; past that, the brief form.
            let detail = problem.detail.unicodeScalars.count > 1024
                ? String(String.UnicodeScalarView(problem.detail.unicodeScalars.prefix(1024))) + "…" : problem.detail
            total += detail.utf8.count
            full[info.identifier] = total <= 64 << 10 ? "\(problem.code) \(detail)" : brief
        }
        func message(_ problems: [String: String]) -> Message {
            .connected(version: protocolVersion, pid: getpid(), extensions: infos.map { $0.identifier },
                       extensionPoints: Dictionary(uniqueKeysWithValues: infos.map { ($0.identifier, $0.extensionPointIdentifier) }),
                       problems: problems)
        }
        return (message(full), message(limited))
    }

    /// What a client of another uid is told of an extension that cannot start.
    static func refusedBriefly(_ identifier: String) -> String {
        "\(identifier): no request can start; the daemon's operator sees why (sdk-host doctor, or its log)"
    }

    // MARK: Clients

    private func acceptClients() {
        guard let listenFD = listener?.rawValue else { return }
        // Bounded per turn like any other reader: a connection storm cannot hold the loop.
        for _ in 0..<64 {
            let accepted: FileDescriptor?
            do {
                accepted = try acceptConnection(listenFD)
            } catch {
                if [EMFILE, ENFILE, ENOBUFS, ENOMEM].contains(error.errno) {
                    backOffAccepting(error)
                } else {
                    engine.log(.error, "accept on \(socketPath): \(error)")
                }
                return
            }
            guard let fd = accepted else {
                acceptBackoff = 0
                return
            }
            acceptBackoff = 0
            let credentials = try? peerCredentials(fd.rawValue)
            admit(fd, credentials: credentials)
        }
    }

    /// A new connection from a peer with `credentials` (nil: the kernel gave none): refused if its uid is not
    /// allowed or there is no room, else a session. The listener's accepts come here, and the simulation's
    /// clients.
    package func admit(_ fd: consuming FileDescriptor, credentials: PeerCredentials?) {
        let connection = FramedConnection(fd, loop: engine.loop, limits: configuration.host.wireLimits)
        connection.keepsPayloads = true  // begins go to workers as the clients wrote them
        guard let credentials, configuration.allowedUIDs.contains(credentials.uid) else {
            let who = credentials.map { "uid \($0.uid) (pid \($0.pid))" } ?? "a peer without credentials"
            engine.log(.warning, "refused \(who): not in AllowedUIDs")
            try? connection.send(.error(message: "\(who) is not allowed to use this daemon", id: nil))
            connection.close()
            return
        }
        if let refusal = makeRoom(for: credentials.uid) {
            refusedWhileFull += 1
            if refusedWhileFull == 1 || refusedWhileFull % 1000 == 0 {
                engine.log(.warning, "refused a client (uid \(credentials.uid) pid \(credentials.pid)): \(refusal); "
                    + "\(refusedWhileFull) refused so far")
            }
            try? connection.send(.error(message: refusal, id: nil))
            connection.close()
            return
        }
        connection.outputLimit = configuration.maxClientOutputBytes
        connection.unreadDescriptorLimit = configuration.maxUnreadDescriptorsPerClient
        connection.inputBudget = inputBudget
        connection.outputBudget = outputBudget
        let session = ClientSession(connection: connection, credentials: credentials, connectedAt: engine.loop.now)
        // A client whose frame breaks the protocol is told why before it is dropped (the log says so too).
        connection.farewell = { end in
            guard case .badInput(let detail) = end else { return nil }
            return .error(message: "bad input: \(detail.prefix(400)); closing this connection", id: nil)
        }
        // A well-formed begin is checked in place and forwarded without being decoded (ForwardScan).
        connection.onForwardable = { [unowned self, unowned session] scanned in
            guard scanned.kind == .begin, session.handshaken,
                let forwarded = session.connection.withForwardablePayload({ payload in
                    payload.map { ForwardedFrame(payload: $0, idRange: scanned.idRange) }
                })
            else { return false }
            self.begin(session, clientID: scanned.id, items: [], extensionID: scanned.extensionID,
                       deadlineMs: scanned.deadlineMs, forwarded: forwarded)
            return true
        }
        do {
            try connection.start(
                onMessage: { [unowned self, unowned session] in self.handle($0, from: session) },
                onEnd: { [unowned self, unowned session] in self.sessionEnded(session, $0) })
        } catch {
            connection.close()
            return
        }
        sessionsAdmitted += 1
        session.number = sessionsAdmitted
        sessions[session.number] = session
        engine.log(.debug, "client uid \(credentials.uid) pid \(credentials.pid) connected")
    }

    /// Makes room for a new connection from `uid` under MaxClientsPerUID and MaxClients: at either limit the
    /// oldest connection (of that uid, or of anyone) that has not said `connect` yet is closed, so that stalled
    /// connections cannot keep everyone else out until the handshake timeout. Returns why the new connection is
    /// refused when every connection in the way has said `connect`, or nil.
    private func makeRoom(for uid: uid_t) -> String? {
        func oldestInHandshake(_ include: (ClientSession) -> Bool) -> ClientSession? {
            sessions.values.filter { !$0.handshaken && include($0) }.min { $0.connectedAt < $1.connectedAt }
        }
        let ofUID = sessions.values.reduce(0) { $0 + ($1.credentials.uid == uid ? 1 : 0) }
        if ofUID >= configuration.maxClientsPerUID {
            guard let oldest = oldestInHandshake({ $0.credentials.uid == uid }) else {
                return "too many connections from uid \(uid): at most \(configuration.maxClientsPerUID) (MaxClientsPerUID)"
            }
            evict(oldest)
        }
        if sessions.count >= configuration.maxClients {
            guard let oldest = oldestInHandshake({ _ in true }) else {
                return "too many clients: the daemon serves at most \(configuration.maxClients) (MaxClients)"
            }
            evict(oldest)
        }
        return nil
    }

    private func evict(_ session: ClientSession) {
        session.send(.error(message: "closed to make room: no 'connect' yet, and the daemon is at its connection limit", id: nil))
        evictedInHandshake += 1
        let quiet = evictedInHandshake > 1 && evictedInHandshake % 1000 != 0
        closeSession(session, reason: quiet ? nil : "no 'connect' yet, closed to make room for a new connection "
            + "(\(evictedInHandshake) so far)")
    }

    /// Out of descriptors (or memory): stop watching the listener for a while instead of spinning on it, and
    /// say so once per episode, not once per attempt.
    private func backOffAccepting(_ error: SystemError) {
        guard let listenFD = listener?.rawValue, acceptBackoffTimer == nil else { return }
        if acceptBackoff == 0 {
            engine.log(.error, "cannot accept clients on \(socketPath): \(error); pausing accepts")
        }
        acceptBackoff = min(max(acceptBackoff * 2, 0.05), 1)
        engine.loop.unregister(listenFD)
        acceptBackoffTimer = engine.loop.schedule(afterNanoseconds: UInt64(acceptBackoff * 1e9)) { [unowned self] in
            self.acceptBackoffTimer = nil
            guard let fd = self.listener?.rawValue else { return }
            try? self.engine.loop.register(fd, events: EventLoop.readable) { [unowned self] _ in self.acceptClients() }
        }
    }

    /// Once a second: close clients that have not said `connect` in time, that have sat on half a frame too
    /// long, or whose unread output has been stuck over the limit too long.
    private func scheduleSweep() {
        engine.loop.schedule(afterNanoseconds: 1_000_000_000) { [unowned self] in
            let now = self.engine.loop.now
            let handshake = UInt64(self.configuration.handshakeTimeout * 1e9)
            let partial = UInt64(self.configuration.partialFrameTimeout * 1e9)
            for session in Array(self.sessions.values) {
                let c = session.connection
                if !session.handshaken, now &- session.connectedAt > handshake {
                    self.closeSession(session, reason: "no 'connect' within \(self.configuration.handshakeTimeout) s")
                } else if let since = c.outputStalledSince, now &- since > partial {
                    // Checked first: while its replies pile up the client is not read, so its frame cannot finish.
                    self.closeSession(session, reason: "\(c.pendingOutputBytes) bytes of replies unread for "
                        + "\(self.configuration.partialFrameTimeout) s")
                } else if let since = c.partialFrameSince, c.outputStalledSince == nil, !c.isPausedForBudget, now &- since > partial {
                    self.closeSession(session, reason: "a frame left unfinished for \(self.configuration.partialFrameTimeout) s")
                }
            }
            // Over the budget with no reply queued since (which would have run it): a client may have gone without
            // reading for long enough since. Under it, any client still held back is read again.
            self.shedOutput()
            if self.outputBudget.isUnderResumeMark { self.resumeReadingClients() }
            if !self.draining { self.scheduleSweep() }
        }
    }

    // MARK: Drain and stop

    private func beginDrain(_ signal: Int32) {
        guard !draining else { return }
        draining = true
        if let timer = reloadTimer {
            engine.loop.cancelTimer(timer)
            reloadTimer = nil
        }
        engine.log(.info, "\(signal > 0 ? signalName(signal) : "stop"): no longer accepting; draining "
            + "\(engine.activeRequestCount) request(s) for up to \(configuration.drainTimeout) s")
        Systemd.notify("STOPPING=1\nSTATUS=draining \(engine.activeRequestCount) request(s)")
        if let fd = listener.take() {
            engine.loop.unregister(fd.rawValue)
            fd.close()
            if !socketActivated { unlink(socketPath) }  // systemd owns an activated socket's path
        }
        if let timer = watchdogTimer { engine.loop.cancelTimer(timer) }
        if let timer = acceptBackoffTimer { engine.loop.cancelTimer(timer) }
        // On the loop's clock (the monotonic one, or the simulation's).
        let deadline = engine.loop.now + UInt64(configuration.drainTimeout * 1e9)
        waitForDrain(until: deadline)
    }

    private func waitForDrain(until deadline: UInt64) {
        if engine.activeRequestCount == 0 || engine.loop.now >= deadline { return stop() }
        engine.loop.schedule(afterNanoseconds: 20_000_000) { [unowned self] in self.waitForDrain(until: deadline) }
    }

    private func stop() {
        // Interrupts what is left (each client is told), kills and reaps workers, then ends the loop.
        engine.shutdownOnLoop { [finished, unowned self] in
            self.stopped = true
            finished.signal()
        }
        for session in Array(sessions.values) { closeSession(session, reason: nil) }
        if let fd = signals.take() {
            engine.loop.unregister(fd.rawValue)
            fd.close()
        }
        engine.log(.info, "stopped")
    }
}
