// The daemon's clients in the simulation: each is one end of a socketpair whose other end the daemon admitted
// as a session (`DaemonServer.admit`), on the same driven loop as the engine. The schedule has them connect,
// begin (some with a file, some for an unknown extension, some past their in-flight cap), cancel, ask for
// status, stop reading and start again, send half a frame (finished later, or never), send garbage, reuse a
// request id, begin before `connect`, connect twice or with another version, and disconnect; a few come from a
// uid the daemon does not allow. A client reads what the daemon sends after every step, unless it has stopped
// reading, and credits each partial result.
//
// Checked after every step: no client request gets two outcomes, no partial result or assignment comes after a
// request's outcome, no client gets an outcome for a request it did not make, and the engine holds exactly the
// embedded requests not yet ended plus the connected clients' requests. After the shutdown: every client read
// to its end; a client that did nothing wrong got exactly one outcome for each of its requests; the daemon
// holds no session, no bytes and no descriptors of a request.
import SDKWire
import SDKHost
import SDKDaemon
import SDKPosix

#if canImport(Glibc)
import Glibc
#endif

/// One simulated daemon client.
package final class SimClient {
    let number: Int
    /// Our end of the socketpair; -1 once closed.
    // `@exclusivity(unchecked)`: the harness's own state, touched by the simulating thread alone, read and written
    // after every step (the runtime's access checks on it were ~3% of a schedule).
    @exclusivity(unchecked) var socket: Int32
    @exclusivity(unchecked) var inbox = SocketInbox()
    @exclusivity(unchecked) var encoder = BinaryPlistEncoder()
    /// It said `connect`.
    @exclusivity(unchecked) var connected = false
    /// The daemon closed its end (we read end-of-file).
    @exclusivity(unchecked) var ended = false
    /// It does not read for now.
    @exclusivity(unchecked) var slow = false
    /// Anything that lets the daemon end its requests without an outcome: garbage, a half frame, a reused id,
    /// not reading, leaving, a refused connection.
    @exclusivity(unchecked) var misbehaved = false
    /// The rest of a frame it sent in part.
    @exclusivity(unchecked) var rest: [UInt8] = []
    /// Its requests, in order, and how many outcomes each got.
    package internal(set) var requests: [RequestID] = []
    package internal(set) var outcomes: [RequestID: Int] = [:]
    /// Ids it began again before reading their outcome: the daemon may have ended the first already (its outcome
    /// unread), so the id can rightly get two outcomes, and an assignment after the first.
    @exclusivity(unchecked) var reused: Set<RequestID> = []
    /// What went wrong, first only.
    @exclusivity(unchecked) var problem: String?

    init(number: Int, socket: Int32) {
        self.number = number
        self.socket = socket
    }

    var isOpen: Bool { socket >= 0 }

    /// Writes `message` as the client library does (the daemon forwards such a begin unread), or, with `plain`,
    /// through the general encoder (decoded on arrival).
    func send(_ message: Message, plain: Bool = false) {
        var bytes: [UInt8] = []
        var outgoing = OutgoingDescriptors()
        if plain {
            guard let frame = try? Frame.encode(message.plist) else { return }
            bytes = frame
        } else {
            guard (try? outgoing.encode(message, with: &encoder, appendingTo: &bytes)) != nil else { return }
        }
        write(bytes, descriptors: message.fileAttachments.map { $0.rawDescriptor })
    }

    func write(_ bytes: [UInt8], descriptors: [Int32] = []) {
        guard isOpen else { return }
        _ = bytes.withUnsafeBytes { try? sendNonBlocking(socket, $0, descriptors: descriptors) }
    }

    func close() {
        guard isOpen else { return }
        SimulatedKernel.current!.close(socket)
        socket = -1
    }

    /// Reads what the daemon sent: checks each reply against the requests this client made, credits partial
    /// results. Until end-of-file with `toTheEnd`.
    func pump(toTheEnd: Bool = false) {
        guard isOpen, !ended, !slow || toTheEnd else { return }
        if inbox.readAll(from: socket) { ended = true }
        while let message = inbox.nextMessage(skippingStatusReports: true) {
            switch message {
            case .complete(let id, _), .cancelled(let id, _), .interrupted(let id, _):
                guard requests.contains(id) else {
                    note("an outcome for \(id), a request this client did not make")
                    continue
                }
                outcomes[id, default: 0] += 1
                if outcomes[id]! > 1, !reused.contains(id) { note("request \(id) got \(outcomes[id]!) outcomes") }
            case .partial(let id, _):
                if outcomes[id] != nil, !reused.contains(id) { note("a partial result of \(id) after its outcome") }
                guard requests.contains(id) else {
                    note("a partial result of \(id), a request this client did not make")
                    continue
                }
                send(.credit(id: id, count: 1))
            case .assigned(let id, _):
                if outcomes[id] != nil, !reused.contains(id) { note("request \(id) assigned after its outcome") }
            default:
                break
            }
        }
    }

    private func note(_ what: String) {
        if problem == nil { problem = "client \(number): \(what)" }
    }
}

/// The schedule's daemon clients.
package final class SimClients {
    package private(set) var clients: [SimClient] = []
    private var opened = 0
    static let maxOpen = 4
    /// The simulating process's user, read once (a getuid and a getgid per client were most of its system calls).
    static let uid = getuid(), gid = getgid()
    /// The files the clients' begins bring.
    package let files: SimFiles

    /// `files`: the memfd the clients' files are made of (the world's, shared by its schedules).
    package init(files: SimFiles) {
        self.files = files
    }

    /// Whether a client began `id` again: the daemon may then run a new request under it (a client's id is the
    /// worker's unless the engine has it in use), so a check that followed the first one by its id stops there.
    func reusedAnywhere(_ id: RequestID) -> Bool { clients.contains { $0.reused.contains(id) } }

    /// Lets every client read what the daemon sent.
    package func pump() {
        for client in clients { client.pump() }
    }

    /// The first thing that went wrong, if anything.
    package var problem: String? { clients.lazy.compactMap { $0.problem }.first }

    /// One client action drawn from `rng`.
    package func step(_ rng: inout SimulationRandom, daemon: DaemonServer, identifier: String, trace: inout StepTrace) {
        let open = clients.filter { $0.isOpen && !$0.ended }
        func pick() -> SimClient? { open.isEmpty ? nil : open[Int(rng.next() % UInt64(open.count))] }
        func short(_ id: RequestID) -> Substring { id.uuidString.prefix(8) }
        /// Begins one request of `client`.
        func begin(_ client: SimClient) {
            let c = client.number
            if !client.connected { client.misbehaved = true }
            let id = RequestID(high: rng.next(), low: rng.next())
            let known = rng.next() % 15 != 0
            let deadline: Int64? = rng.next() % 5 == 0 ? Int64(rng.next() % 3000) : nil
            let files = rng.next() % 8 == 0 ? [self.files.next()].compactMap { $0 } : []
            let plain = rng.next() % 4 == 0
            client.requests.append(id)
            trace.append("client \(c) begins \(short(id))" + (known ? "" : " for an unknown extension")
                + (deadline.map { " deadline \($0) ms" } ?? "") + (files.isEmpty ? "" : " with a file") + (plain ? " (plain)" : ""))
            client.send(.begin(id: id, items: [ExtensionItem(title: "sim", fileAttachments: files)],
                               extensionID: known ? identifier : "com.example.none", deadlineMs: deadline), plain: plain)
        }
        let roll = rng.next() % 100
        if open.isEmpty || (roll < 8 && open.count < Self.maxOpen) {
            let (daemonEnd, clientEnd) = SimulatedKernel.current!.socketPair()
            let pair = [daemonEnd, clientEnd]
            opened += 1
            let client = SimClient(number: opened, socket: pair[1])
            clients.append(client)
            // One in ten from a uid the daemon does not allow: refused at once.
            let allowed = rng.next() % 10 != 0
            if !allowed { client.misbehaved = true }
            trace.append("client \(client.number) connects" + (allowed ? "" : " from a uid not allowed"))
            // Admitted in the loop's turn, as the listener's accept is.
            let fd = pair[0], credentials = PeerCredentials(pid: 700_000 + pid_t(opened), uid: allowed ? Self.uid : 4242, gid: Self.gid)
            daemon.engine.loop.execute { daemon.admit(FileDescriptor(adopting: fd), credentials: credentials) }
            // Most say `connect` at once, as the client library does.
            if rng.next() % 10 != 0 {
                client.connected = true
                client.send(.connect(version: protocolVersion, app: "c\(client.number % 3)"))
            }
            return
        }
        guard let client = pick() else { return }
        let c = client.number
        switch roll {
        case 8..<12:
            let version = rng.next() % 20 == 0 ? protocolVersion + 1 : protocolVersion
            if client.connected || version != protocolVersion { client.misbehaved = true }
            trace.append("client \(c) says connect" + (client.connected ? " again" : "") + (version != protocolVersion ? " with version \(version)" : ""))
            client.connected = true
            client.send(.connect(version: version, app: "c\(c % 3)"))
        case 12..<55:
            // One in ten is a burst of eight: past the daemon's in-flight cap (6 here), some end `overloaded`.
            let burst = rng.next() % 10 == 0
            if burst { trace.append("client \(c): a burst of 8 begins") }
            for _ in 0..<(burst ? 8 : 1) { begin(client) }
        case 55..<63:
            guard let id = client.requests.last(where: { client.outcomes[$0] == nil }) ?? client.requests.last else { break }
            trace.append("client \(c) cancels \(short(id))")
            client.send(.cancel(id: id))
        case 63..<65:
            trace.append("client \(c) disconnects")
            client.misbehaved = true
            client.close()
        case 65..<68:
            guard client.rest.isEmpty else { break }
            let frame = (try? Frame.encode(Message.status(seq: 1).plist)) ?? []
            let cut = Int(rng.next() % UInt64(max(frame.count - 1, 1))) + 1
            trace.append("client \(c) sends \(cut) of a frame's \(frame.count) bytes")
            client.misbehaved = true
            client.write(Array(frame[..<cut]))
            client.rest = Array(frame[cut...])
        case 68..<70:
            trace.append("client \(c) sends garbage")
            client.misbehaved = true
            client.write([0, 0, 0, 5, 0xFF, 0xFE, 0xFD, 0xFC, 0xFB])
        case 70..<73:
            client.slow.toggle()
            if client.slow { client.misbehaved = true }
            trace.append("client \(c) " + (client.slow ? "stops reading" : "reads again"))
        case 73..<82:
            trace.append("client \(c) asks for status")
            client.send(.status(seq: Int64(rng.next() % 1000)))
        case 82..<84:
            guard let id = client.requests.last(where: { client.outcomes[$0] == nil }) else { break }
            trace.append("client \(c) begins \(short(id)) again while it runs")
            client.misbehaved = true
            client.reused.insert(id)
            client.send(.begin(id: id, items: [], extensionID: identifier))
        default:
            guard !client.rest.isEmpty else { break }
            trace.append("client \(c) sends the rest of its frame")
            client.write(client.rest)
            client.rest = []
        }
    }

    /// After the daemon stopped: every client reads to its end; a client that did nothing wrong must have one
    /// outcome per request. Returns what is wrong, then closes every client.
    package func finish() -> String? {
        defer { for client in clients { client.close() } }
        for client in clients { client.pump(toTheEnd: true) }
        if let problem { return problem }
        for client in clients where client.isOpen && !client.ended {
            return "client \(client.number): its connection is still open after the daemon stopped"
        }
        for client in clients where !client.misbehaved {
            if let id = client.requests.first(where: { client.outcomes[$0] != 1 }) {
                return "client \(client.number) did nothing wrong, yet request \(id) got \(client.outcomes[id] ?? 0) outcome(s)"
            }
        }
        return nil
    }
}
