// The daemon against clients that attack it on purpose. Each test runs a real `sdk-host serve`, attacks it
// through raw sockets, and then checks the same things: the daemon is alive, its RSS is under 512 MB, a second
// well-behaved client is served, the log stayed bounded, and every request the attacker began got exactly one
// outcome or its connection was dropped.
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Asserts the daemon survived: alive, bounded, serving a new client.
func expectHealthy(_ daemon: DaemonProcess, maxLogBytes: Int = 2 << 20, sourceLocation: SourceLocation = #_sourceLocation) async throws {
    #expect(daemon.isAlive, "the daemon is alive", sourceLocation: sourceLocation)
    let rss = daemon.residentBytes ?? .max
    #expect(rss < 512 << 20, "daemon RSS \(rss >> 20) MB", sourceLocation: sourceLocation)
    let good = try HostileClient(daemon.socket)
    good.handshake()
    let (id, message) = begin("com.example.echo", "still here")
    good.send(message)
    let outcome = good.outcome(of: id, timeout: 20)
    #expect(outcome == .complete(id: id, items: [ExtensionItem(title: "still here")]), "a new client is served",
            sourceLocation: sourceLocation)
    #expect(daemon.logBytes < maxLogBytes, "log \(daemon.logBytes) bytes", sourceLocation: sourceLocation)
}

@Suite(.serialized) struct HostileClientTests {
    @Test func hugeAndNegativeDeadlinesAreClampedNotTrapped() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let client = try HostileClient(daemon.socket)
        client.handshake()
        let (huge, hugeBegin) = begin("com.example.echo", "huge", deadlineMs: .max)
        client.send(hugeBegin)
        #expect(client.outcome(of: huge) == .complete(id: huge, items: [ExtensionItem(title: "huge")]))
        let (negative, negativeBegin) = begin("com.example.crasher", "slow:2000", deadlineMs: .min)
        client.send(negativeBegin)
        #expect(client.outcome(of: negative) == .interrupted(id: negative, reason: InterruptionReason.timedOut.plist))
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    @Test func amplifyingFramesAreRejectedWithinBudget() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        // 74 KB and 1 MB frames whose shared references would expand to 1 GB and 64 GB.
        for (dataBytes, references) in [(8192, 32_768), (65_536, 480_000)] {
            let client = try HostileClient(daemon.socket)
            client.handshake()
            client.write(frame(amplifyingPayload(dataBytes: dataBytes, references: references)))
            #expect(client.isClosedByDaemon(), "the attacker is dropped")
        }
        #expect(daemon.logText.contains("budget"))
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    @Test func aFloodOfLargeBeginsEndsOverloadedAndStaysBounded() async throws {
        let daemon = try await DaemonProcess(extraConfig: "<key>LogLevel</key><string>warning</string>")
        defer { daemon.remove() }
        let client = try HostileClient(daemon.socket)
        client.handshake()
        // 400 x 1 MiB begins on a slow extension: far more than the per-client byte allowance (64 MiB).
        var ids: [RequestID] = []
        for _ in 0..<400 {
            let (id, message) = begin("com.example.crasher", "slow:3000", attachmentBytes: 1 << 20)
            ids.append(id)
            if !client.send(message) { break }
        }
        var outcomes: [RequestID: String] = [:]
        let deadline = monotonicNanoseconds() + 120_000_000_000
        while outcomes.count < ids.count, monotonicNanoseconds() < deadline {
            guard let message = client.receive(timeout: 2) else { continue }
            switch message {
            case .complete(let id, _): outcomes[id, default: ""] += "c"
            case .cancelled(let id, _): outcomes[id, default: ""] += "x"
            case .interrupted(let id, let reason): outcomes[id, default: ""] += InterruptionReason(plist: reason) == .overloaded ? "o" : "i"
            default: break
            }
            #expect((daemon.residentBytes ?? 0) < 512 << 20)
        }
        #expect(outcomes.count == ids.count, "every request ended")
        #expect(outcomes.values.allSatisfy { $0.count == 1 }, "exactly once")
        #expect(outcomes.values.filter { $0 == "o" }.count > 300, "most are overloaded at once")
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    /// A begin that is decoded and kept (it brings a file: not forwarded as it came) and holds more than a
    /// client's requests may hold (64 MiB) ends at once as a protocol violation saying so, not `overloaded`, which
    /// says to try again: it never fits. A 13 MB begin of 150,000 small items, one with a key in UTF-16 (read as
    /// a tree), is charged ~82 MB.
    @Test func aBeginThatNeverFitsIsRefusedNotOverloaded() async throws {
        let daemon = try await DaemonProcess(extraConfig: "<key>LogLevel</key><string>warning</string>")
        defer { daemon.remove() }
        let client = try HostileClient(daemon.socket)
        client.handshake()
        let id = RequestID()
        let items = Array(repeating: ExtensionItem(title: "x"), count: 150_000)
        guard case .dictionary(var fields) = Message.begin(id: id, items: items, extensionID: "com.example.echo").plist,
            case .array(var raw)? = fields["items"], case .dictionary(var first) = raw[0]
        else { Issue.record("not a begin's plist"); return }
        first["tïtle"] = "ignored"
        first["files"] = [0]
        raw[0] = .dictionary(first)
        fields["items"] = .array(raw)
        fields["fds"] = 1
        let frame = try Frame.encode(.dictionary(fields), limits: WireLimits(maxFrameBytes: 16 << 20))
        let file = try FileAttachment(bytes: [1, 2, 3])
        #expect(client.write(frame, descriptors: [file.rawDescriptor]))
        var outcome: Message?
        let deadline = monotonicNanoseconds() + 60_000_000_000
        while outcome == nil, monotonicNanoseconds() < deadline {
            switch client.receive(timeout: 2) {
            case let m?:
                switch m {
                case .interrupted(id, _), .complete(id, _), .cancelled(id, _): outcome = m
                default: break
                }
            case nil: break
            }
        }
        guard case .interrupted(let endedID, let reason)? = outcome, endedID == id,
            case .protocolViolation(let detail) = InterruptionReason(plist: reason)
        else { Issue.record("ended \(outcome?.typeName ?? "never")"); return }
        #expect(detail.contains("a client's requests may hold"), "\(detail)")
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    @Test func aClientThatNeverReadsIsCutOff() async throws {
        let daemon = try await DaemonProcess(extraConfig: """
            <key>LogLevel</key><string>warning</string>
            <key>MaxClientOutputBytes</key><integer>1048576</integer>
            <key>PartialFrameTimeoutSeconds</key><real>1</real>
            """)
        defer { daemon.remove() }
        let client = try HostileClient(daemon.socket)
        client.handshake()
        // Echo requests with 256 KiB each, replies never read: the first slice buffered them all (1.9 GB).
        var sent = 0
        for _ in 0..<2000 {
            let (_, message) = begin("com.example.echo", "unread", attachmentBytes: 256 << 10)
            guard client.send(message) else { break }
            sent += 1
            if sent % 100 == 0, (daemon.residentBytes ?? 0) > 400 << 20 { break }
        }
        #expect(client.isClosedByDaemon(timeout: 30), "the client that does not read is disconnected")
        #expect(await eventually(timeout: 10) { daemon.logText.contains("unread") }, "\(daemon.logText)")
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    @Test func clientsThatNeverReadAreCutOffAtTheSharedOutputBudget() async throws {
        // Each client may hold 8 MiB of replies; all of them together 4 MiB. Twenty such clients took a daemon
        // past 1 GB, each within its own limit.
        let daemon = try await DaemonProcess(extraConfig: """
            <key>LogLevel</key><string>warning</string>
            <key>MaxClientOutputBytes</key><integer>8388608</integer>
            <key>MaxClientOutputBytesTotal</key><integer>4194304</integer>
            <key>PartialFrameTimeoutSeconds</key><real>2</real>
            """)
        defer { daemon.remove() }
        // Four clients that never read: 3 MiB of echoes each.
        var attackers: [HostileClient] = []
        for _ in 0..<4 {
            let client = try HostileClient(daemon.socket)
            client.handshake()
            for _ in 0..<12 {
                let (_, message) = begin("com.example.echo", "unread", attachmentBytes: 256 << 10)
                guard client.send(message) else { break }
            }
            attackers.append(client)
        }
        // A client that reads what it is sent, meanwhile: served, and never cut off.
        let reader = try HostileClient(daemon.socket)
        reader.handshake()
        for i in 0..<8 {
            let (id, message) = begin("com.example.echo", "read \(i)", attachmentBytes: 256 << 10)
            reader.send(message)
            guard case .complete? = reader.outcome(of: id, timeout: 20) else {
                Issue.record("the reading client was not answered: \(daemon.logText)")
                return
            }
        }
        // Those holding the most, which have taken nothing for PartialFrameTimeoutSeconds, go until the total is
        // under 4 MiB: at least two of the four (3 MiB each, less what the kernel holds for them).
        // (Told by a hang-up, without reading what waits for them.)
        #expect(await eventually(timeout: 30) { attackers.filter(\.isHungUpUnread).count >= 2 }, "\(daemon.logText)")
        #expect(await eventually(timeout: 10) { daemon.logText.contains("passed MaxClientOutputBytesTotal (4194304 bytes)") },
                "\(daemon.logText)")
        // The reader is still served on its own connection.
        let (last, message) = begin("com.example.echo", "last", attachmentBytes: 256 << 10)
        reader.send(message)
        guard case .complete? = reader.outcome(of: last, timeout: 20) else {
            Issue.record("the reading client was cut off: \(daemon.logText)")
            return
        }
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    @Test func clientsWithRepliesWaitingAreNotReadWhileAllRepliesAreOverTheBudget() async throws {
        // Reading slowly enough to stay under its own MaxClientOutputBytes, each of many clients could hold that much:
        // past the total, a client holding more than its share is not read (it can begin nothing more) until it
        // holds under half its share. They are not disconnected: they read; and each waits on its own reading, not
        // on the others' (read here one after the other).
        let daemon = try await DaemonProcess(extraConfig: """
            <key>MaxClientOutputBytesTotal</key><integer>65536</integer>
            <key>PartialFrameTimeoutSeconds</key><real>30</real>
            <key>LogLevel</key><string>warning</string>
            """)
        defer { daemon.remove() }
        // Three clients begin six slow echoes of 64 KiB each and read nothing yet: the replies come 0.3 s later,
        // when every begin has been read, 1.1 MiB of them, past what the kernel holds for each client.
        var clients: [(client: HostileClient, ids: [RequestID])] = []
        for c in 0..<3 {
            let client = try HostileClient(daemon.socket)
            client.handshake()
            var ids: [RequestID] = []
            for i in 0..<6 {
                let (id, message) = begin("com.example.crasher", "slow:300", attachmentBytes: (64 << 10) + c * 8 + i)
                #expect(client.send(message))
                ids.append(id)
            }
            clients.append((client, ids))
        }
        #expect(await eventually(timeout: 30) { daemon.logText.contains("are not read until they hold under half that") },
                "\(daemon.logText)")
        // They read: every reply arrives, and then each is read again (a new request is answered).
        for (c, (client, ids)) in clients.enumerated() {
            // In whatever order they come (the requests run side by side).
            let left = ids.count - client.completions(of: ids, timeout: 30).count
            #expect(left == 0, "client \(c): \(left) of its replies did not arrive: \(daemon.logText)")
        }
        for (c, entry) in clients.enumerated() {
            let (id, message) = begin("com.example.echo", "again \(c)")
            #expect(entry.client.send(message))
            #expect(entry.client.outcome(of: id, timeout: 20) == .complete(id: id, items: [ExtensionItem(title: "again \(c)")]),
                    "\(daemon.logText)")
        }
        #expect(!daemon.logText.contains("closing client"), "\(daemon.logText)")
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    @Test func halfSentFramesAreBoundedAndTimedOut() async throws {
        let daemon = try await DaemonProcess(extraConfig: """
            <key>LogLevel</key><string>warning</string>
            <key>PartialFrameTimeoutSeconds</key><real>1</real>
            """)
        defer { daemon.remove() }
        // 60 connections, each a 16 MiB - 1 frame of which all but one byte is sent: 1 GB if all were held.
        var clients: [HostileClient] = []
        let chunk = [UInt8](repeating: 0, count: 1 << 20)
        for _ in 0..<60 {
            let client = try HostileClient(daemon.socket)
            client.handshake()
            client.write([0x00, 0xFF, 0xFF, 0xFF])
            for _ in 0..<15 where client.write(chunk) {}
            clients.append(client)
            #expect((daemon.residentBytes ?? 0) < 512 << 20)
        }
        for client in clients { #expect(client.isClosedByDaemon(timeout: 30)) }
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    @Test func aClientWhoseReadsNeverEndOnAFrameBoundaryIsNotTimedOut() async throws {
        let daemon = try await DaemonProcess(extraConfig: """
            <key>LogLevel</key><string>warning</string>
            <key>PartialFrameTimeoutSeconds</key><real>1</real>
            """)
        defer { daemon.remove() }
        let client = try HostileClient(daemon.socket)
        client.handshake()
        // Each write is the rest of one begin and the first half of the next, so the daemon's buffer never
        // empties, for 4 s (four partial-frame timeouts); every begin still finishes, and is answered.
        let frames = (0..<40).map { i in begin("com.example.echo", "split \(i)") }
        var ids: [RequestID] = []
        var carried: [UInt8] = []
        for (id, message) in frames {
            let bytes = try Frame.encode(message.plist, limits: WireLimits())
            let half = bytes.count / 2
            guard client.write(carried + Array(bytes[..<half])) else {
                Issue.record("the daemon closed a client whose frames all finish: \(daemon.logText)")
                return
            }
            carried = Array(bytes[half...])
            ids.append(id)
            try await Task.sleep(nanoseconds: 100_000_000)
        }
        #expect(client.write(carried))
        let completed = Set(client.completions(of: ids, timeout: 60).filter { $0.value.first?.title?.hasPrefix("split") == true }.keys)
        #expect(completed == Set(ids), "\(completed.count) of \(ids.count) completed: \(daemon.logText)")
        #expect(!daemon.logText.contains("left unfinished"), "\(daemon.logText)")
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    @Test func stalledConnectionsCannotKeepOthersOut() async throws {
        let daemon = try await DaemonProcess(extraConfig: """
            <key>MaxClients</key><integer>40</integer>
            <key>HandshakeTimeoutSeconds</key><real>4</real>
            """)
        defer { daemon.remove() }
        var idle: [HostileClient] = []
        for _ in 0..<120 { idle.append(try HostileClient(daemon.socket)) }
        // At MaxClients the oldest connection still without `connect` makes room: 80 of the 120 are closed with a
        // reason as later ones arrive, and the newest 40 hold every slot, until their handshake timeout.
        var evicted = 0
        var kept: [HostileClient] = []
        for client in idle {
            if case .error(let message, _)? = client.receive(timeout: 8), message.contains("closed to make room") {
                evicted += 1
            } else {
                kept.append(client)
            }
        }
        #expect(evicted == 80, "\(evicted) closed to make room")
        // With every slot held by a stalled connection, an app still gets in, and is served.
        let app = try await ExtensionHost.connect(socketPath: daemon.socket)
        #expect(try await app.extension(identifier: "com.example.echo").perform([ExtensionItem(title: "in")]).first?.title == "in")
        for client in kept { #expect(client.isClosedByDaemon()) }
        idle.removeAll()
        kept.removeAll()
        await app.shutdown()
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    @Test func connectionsThatSaidConnectAreNeverEvictedAndEachUIDHasACap() async throws {
        let daemon = try await DaemonProcess(extraConfig: """
            <key>MaxClients</key><integer>6</integer>
            <key>MaxClientsPerUID</key><integer>4</integer>
            """)
        defer { daemon.remove() }
        var held: [HostileClient] = []
        for _ in 0..<4 {
            let client = try HostileClient(daemon.socket)
            client.handshake()
            guard case .connected? = client.receive() else { Issue.record("no 'connected'"); return }
            held.append(client)
        }
        let fifth = try HostileClient(daemon.socket)
        guard case .error(let message, _)? = fifth.receive() else { Issue.record("the fifth was not refused"); return }
        #expect(message == "too many connections from uid \(getuid()): at most 4 (MaxClientsPerUID)")
        #expect(fifth.isClosedByDaemon())
        // Every held connection still works.
        for client in held {
            #expect(client.send(.ping(seq: 7)))
            guard case .pong(7)? = client.receive() else { Issue.record("a held client was dropped"); return }
        }
        held.removeAll()
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    /// A client that asks for results carrying descriptors and never reads them would hold the daemon's
    /// descriptors, and the kernel's count of descriptors in flight for the daemon's user, which other apps'
    /// descriptor passing needs: past MaxUnreadDescriptorsPerClient it is disconnected, and the others pass on.
    @Test func aClientThatNeverReadsTheDescriptorsItIsSentIsDisconnected() async throws {
        let daemon = try await DaemonProcess(extraConfig: "<key>MaxUnreadDescriptorsPerClient</key><integer>16</integer>")
        defer { daemon.remove() }
        let hoarder = try HostileClient(daemon.socket)
        #expect(hoarder.handshake())
        let file = try FileAttachment(bytes: Array("a descriptor".utf8))
        for _ in 0..<64 {
            let message = Message.begin(id: RequestID(), items: [ExtensionItem(fileAttachments: [file])],
                                        extensionID: "com.example.echo")
            let bytes = try Frame.encode(message.plist, limits: WireLimits())
            guard hoarder.write(bytes, descriptors: [file.rawDescriptor]) else { break }
        }
        #expect(await eventually(timeout: 30) { daemon.logText.contains("descriptors unread (at most 16)") }, "\(daemon.logText)")
        #expect(hoarder.isClosedByDaemon())
        // Another app's descriptors still pass both ways.
        let app = try await ExtensionHost.connect(socketPath: daemon.socket)
        let back = try await app.extension(identifier: "com.example.echo").perform(
            [ExtensionItem(fileAttachments: [try FileAttachment(bytes: Array("mine".utf8))])])
        #expect(try back.first?.fileAttachments.first?.readAll() == Array("mine".utf8))
        await app.shutdown()
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    @Test func messagesBeforeConnectAndGarbageDropOnlyThatClient() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let early = try HostileClient(daemon.socket)
        let (_, message) = begin("com.example.echo", "too early")
        early.send(message)
        #expect(early.isClosedByDaemon())
        let twice = try HostileClient(daemon.socket)
        twice.handshake()
        twice.handshake()
        #expect(twice.isClosedByDaemon())
        // A client library of protocol 1 (before host services) is told which version this daemon speaks.
        let old = try HostileClient(daemon.socket)
        old.send(.connect(version: 1))
        let refusal = old.receive()
        guard case .error(let text, _)? = refusal else {
            Issue.record("\(String(describing: refusal))")
            return
        }
        #expect(text.contains("protocol 1 is not supported; this daemon speaks \(protocolVersion)"), "\(text)")
        #expect(old.isClosedByDaemon())
        // A request id in lower case is not the protocol's form: answered under the upper-case one, the client
        // would never see its outcome under the id it knows.
        let (id, _) = begin("com.example.echo", "lower")
        let lower = frame(BinaryPlistEncoder.encode(["type": "begin", "id": .string(id.uuidString.lowercased()),
                                                     "extension": "com.example.echo", "items": [["title": "lower"]]]))
        for junk: [UInt8] in [[0xFF, 0xFF, 0xFF, 0xFF], frame(Array("bplist00 but not really".utf8)), frame([]), lower] {
            let client = try HostileClient(daemon.socket)
            client.handshake()
            client.write(junk)
            // Told why before it is dropped.
            var told: String?
            while told == nil, let message = client.receive() { if case .error(let text, nil) = message { told = text } }
            #expect(told?.hasPrefix("bad input: ") == true && told?.hasSuffix("; closing this connection") == true,
                    "\(junk.prefix(8)): \(String(describing: told))")
            #expect(client.isClosedByDaemon())
        }
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    /// A client's request keeps its id towards the worker, so a crash report names the id the client knows (it
    /// named another); an id the engine has in use (another client's request, or one a worker still runs after
    /// its deadline) gets a fresh one, and each client still gets its own answer.
    @Test func aClientsIdIsTheWorkersUnlessItIsInUse() async throws {
        let daemon = try await DaemonProcess(extraConfig: "<key>CancelGraceSeconds</key><real>30</real>")
        defer { daemon.remove() }
        let first = try HostileClient(daemon.socket), second = try HostileClient(daemon.socket)
        first.handshake()
        second.handshake()
        // The same id from two clients at once: both run, each answered with its own.
        let (shared, firstBegin) = begin("com.example.crasher", "slow:800")
        first.send(firstBegin)
        second.send(.begin(id: shared, items: [ExtensionItem(title: "slow:900")], extensionID: "com.example.crasher", deadlineMs: nil))
        #expect(first.outcome(of: shared) == .complete(id: shared, items: [ExtensionItem(title: "slow:800")]))
        #expect(second.outcome(of: shared) == .complete(id: shared, items: [ExtensionItem(title: "slow:900")]))
        // An id reused while a worker still runs it (its deadline passed; the worker ignores the cancel): apart.
        let (ignored, ignoredBegin) = begin("com.example.crasher", "hang", deadlineMs: 200)
        first.send(ignoredBegin)
        #expect(first.outcome(of: ignored) == .interrupted(id: ignored, reason: InterruptionReason.timedOut.plist))
        second.send(.begin(id: ignored, items: [ExtensionItem(title: "echo")], extensionID: "com.example.crasher", deadlineMs: nil))
        #expect(second.outcome(of: ignored) == .complete(id: ignored, items: [ExtensionItem(title: "echo")]))
        // A worker that dies with a request names the client's id in its crash report.
        let (crashed, crashBegin) = begin("com.example.crasher", "segv")
        second.send(crashBegin)
        #expect(second.outcome(of: crashed) == .interrupted(id: crashed, reason: InterruptionReason.signal(SIGSEGV).plist))
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        let reports = await host.status()?.recentCrashes ?? []
        #expect(reports.contains { $0.inFlightRequests == [crashed] }, "\(reports.map(\.inFlightRequests))")
        await host.shutdown()
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    /// One worker: an id reused while that worker still runs it (past its deadline, the cancel ignored) must not
    /// reach it as that id, or the new request's answer would settle the old one and the worker would never be
    /// killed for ignoring the cancel.
    @Test func anIdAWorkerStillRunsIsNotReusedTowardsIt() async throws {
        let single = TemporaryExtension(identifier: "com.example.single", executable: "Crasher",
                                        policy: "<key>MaxWorkers</key><integer>1</integer>")
        defer { single.remove() }
        let daemon = try await DaemonProcess(extraConfig: "<key>CancelGraceSeconds</key><real>1</real>", extraSearchPaths: [single.root])
        defer { daemon.remove() }
        let first = try HostileClient(daemon.socket), second = try HostileClient(daemon.socket)
        first.handshake()
        second.handshake()
        let (ignored, ignoredBegin) = begin("com.example.single", "hang", deadlineMs: 200)
        first.send(ignoredBegin)
        #expect(first.outcome(of: ignored) == .interrupted(id: ignored, reason: InterruptionReason.timedOut.plist))
        second.send(.begin(id: ignored, items: [ExtensionItem(title: "echo")], extensionID: "com.example.single", deadlineMs: nil))
        #expect(second.outcome(of: ignored) == .complete(id: ignored, items: [ExtensionItem(title: "echo")]))
        // The worker that ignored the cancel is killed after the grace period, its report naming that request.
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        #expect(await eventually(timeout: 30) {
            await host.status()?.recentCrashes.contains { $0.reason == .hang && $0.inFlightRequests == [ignored] } == true
        })
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func oneClientsZeroDeadlineNeverInterruptsAnother() async throws {
        let daemon = try await DaemonProcess(extraConfig: "<key>CancelGraceSeconds</key><real>1</real>")
        defer { daemon.remove() }
        let victim = try HostileClient(daemon.socket)
        victim.handshake()
        let (slow, slowBegin) = begin("com.example.crasher", "slow:1500")
        victim.send(slowBegin)
        var assigned = false
        while !assigned, let message = victim.receive() { if case .assigned = message { assigned = true } }
        #expect(assigned, "the victim's request is on a worker")
        let attacker = try HostileClient(daemon.socket)
        attacker.handshake()
        var attacks: [RequestID] = []
        // The extension honours cancels; the first slice killed the shared worker on any passed deadline.
        // (A worker that ignores the cancel is killed after the grace period with whatever it runs: keeping
        // apps apart on separate workers is WorkerSharing's job.)
        for _ in 0..<20 {
            let (id, message) = begin("com.example.crasher", "slow:5000", deadlineMs: 0)
            attacks.append(id)
            attacker.send(message)
        }
        for id in attacks {
            #expect(attacker.outcome(of: id) == .interrupted(id: id, reason: InterruptionReason.timedOut.plist))
        }
        #expect(victim.outcome(of: slow) == .complete(id: slow, items: [ExtensionItem(title: "slow:1500")]))
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    @Test func acceptBacksOffAtTheDescriptorLimit() async throws {
        let daemon = try await DaemonProcess(extraConfig: "<key>LogLevel</key><string>info</string>",
                                             descriptorLimit: 48)
        defer { daemon.remove() }
        // libdispatch traps if it cannot make its epoll descriptor when its first worker thread starts; on a
        // loaded machine that came after the clients below, and the daemon died of SIGILL. It must exist (beside
        // the daemon's own loop's) before the socket accepts.
        let epolls = (listNames("/proc/\(daemon.pid)/fd") ?? []).filter { readLink("/proc/\(daemon.pid)/fd/\($0)") == "anon_inode:[eventpoll]" }
        #expect(epolls.count == 2, "the daemon's loop and libdispatch each hold an epoll descriptor: \(epolls)")
        var clients: [HostileClient] = []
        for _ in 0..<80 { if let c = try? HostileClient(daemon.socket) { clients.append(c) } }
        let cpuBefore = daemon.cpuSeconds
        let logBefore = daemon.logBytes
        try await Task.sleep(nanoseconds: 3_000_000_000)
        // The first slice spun at 100% CPU and wrote 157 MB of log in 5 s.
        #expect(daemon.cpuSeconds - cpuBefore < 1.0, "no busy loop at EMFILE")
        #expect(daemon.logBytes - logBefore < 64 << 10, "the log stays quiet")
        clients.removeAll()
        try await expectHealthy(daemon)
        #expect(await daemon.stop() == 0)
    }

    @Test func aStalledLogReaderDoesNotBlockTheLoop() async throws {
        var template = "/tmp/sdkhost-fifo-XXXXXX".utf8CString
        let folder = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        defer { removeFolder(folder) }
        let fifo = "\(folder)/log.fifo"
        #expect(mkfifo(fifo, 0o600) == 0)
        // A reader that never reads: the daemon's stderr pipe fills after 64 KiB.
        let reader = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        defer { close(reader) }
        let daemon = try await DaemonProcess(extraConfig: "<key>LogLevel</key><string>debug</string>", stderrPath: fifo)
        defer { daemon.remove() }
        let client = try HostileClient(daemon.socket)
        client.handshake()
        // Each refused or cancelled request logs lines at debug level: far more than 64 KiB.
        for _ in 0..<3000 {
            let (id, message) = begin("com.example.echo", String(repeating: "x", count: 200))
            client.send(message)
            client.send(.cancel(id: id))
        }
        let started = monotonicNanoseconds()
        let good = try HostileClient(daemon.socket)
        good.handshake()
        let (id, message) = begin("com.example.echo", "served")
        good.send(message)
        #expect(good.outcome(of: id, timeout: 30) == .complete(id: id, items: [ExtensionItem(title: "served")]))
        let waited = Double(monotonicNanoseconds() - started) / 1e9
        #expect(waited < 10, "served after \(waited) s with nobody reading the log (the first slice: 15 s)")
        #expect(daemon.isAlive)
        kill(daemon.pid, SIGKILL)
    }
}
