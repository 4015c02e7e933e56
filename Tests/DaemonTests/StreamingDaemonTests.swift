// Streaming and descriptor attachments through a real daemon: partial results forwarded in order with the
// client's credit pacing the worker, a crash mid-stream, files passed both ways, and hostile clients whose
// descriptors the daemon must close (a frame that claims more than it brought, a pipe, more than 64 at once,
// descriptors on a message that carries none, past MaxDescriptorsPerClient). After each, the daemon holds no
// descriptor of the test's files and serves on.
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct StreamingDaemonTests {
    /// The daemon's descriptors that point into `folder` or at a memfd.
    static func heldFiles(_ pid: pid_t, _ folder: String) -> [String] {
        (listNames("/proc/\(pid)/fd") ?? []).compactMap { readLink("/proc/\(pid)/fd/\($0)") }
            .filter { $0.hasPrefix(folder) || $0.hasPrefix("/memfd:") }
    }

    /// A stream whose partial results carry files, as many as the protocol lets a worker send uncredited (16
    /// results of 64 descriptors), reaches a client that reads it as fast as it can. The daemon's default limit on
    /// descriptors a client has not read yet was 256, a quarter of one such burst: the client was disconnected
    /// (an outside attack's `sdk-host request --stream`, 5 runs in 6).
    @Test func aStreamOfFilesWithinTheCreditWindowReachesAClientThatReads() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        let ticker = try host.extension(identifier: "com.example.ticker")
        for _ in 0..<3 {
            var files = 0, batches = 0
            do {
                for try await batch in ticker.stream([ExtensionItem(text: "16:0:64")]) {
                    batches += 1
                    files += batch.reduce(0) { $0 + $1.fileAttachments.count }
                }
            } catch {
                Issue.record("the stream ended \(error); log: \(daemon.logText.suffix(400))")
            }
            #expect(batches == 17 && files == 16 * 64, "\(batches) batches, \(files) files")
        }
        #expect(!daemon.logText.contains("descriptors unread"), "\(daemon.logText.suffix(400))")
        #expect(await daemon.stop() == 0)
    }

    @Test func partialResultsAndFilesGoThroughTheDaemon() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let files = try TemporaryFolder()
        let bytes = (0..<(2 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        try SDKHost.writeFile("\(files.path)/in.bin", bytes, mode: 0o600)
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)

        let ticker = try host.extension(identifier: "com.example.ticker")
        var batches: [[ExtensionItem]] = []
        for try await batch in ticker.stream([ExtensionItem(text: "5:10")]) { batches.append(batch) }
        #expect(batches.map { $0.first?.title } == ["tick 1/5", "tick 2/5", "tick 3/5", "tick 4/5", "tick 5/5", "done"])

        // The client's credit paces the worker through the daemon as in an embedded host.
        var iterator = ticker.stream([ExtensionItem(text: "40:0")]).makeAsyncIterator()
        _ = try await iterator.next()
        try await Task.sleep(nanoseconds: 1_000_000_000)
        let resumed = monotonicNanoseconds()
        var rest: [[ExtensionItem]] = []
        while let batch = try await iterator.next() { rest.append(batch) }
        let madeAt = { (i: Int64) in rest.first { $0.first?.userInfo["index"]?.integerValue == i }?.first?.userInfo["madeAtNs"]?.integerValue ?? 0 }
        #expect(madeAt(17) < Int64(resumed) && madeAt(19) > Int64(resumed), "17: \(madeAt(17)), 19: \(madeAt(19)), resumed \(resumed)")

        let crasher = try host.extension(identifier: "com.example.crasher")
        var titles: [String?] = []
        do {
            for try await batch in crasher.stream([ExtensionItem(title: "stream-abort:4")]) { titles.append(batch.first?.title) }
            Issue.record("no interruption")
        } catch let failure as RequestFailure {
            #expect(failure == .interrupted(.signal(SIGABRT)))
        }
        #expect(titles == ["partial 0", "partial 1", "partial 2", "partial 3"])

        let echo = try host.extension(identifier: "com.example.echo")
        let back = try await echo.perform([ExtensionItem(fileAttachments: [
            try FileAttachment(contentsOf: "\(files.path)/in.bin"), try FileAttachment(bytes: [7, 7, 7]),
        ])])
        #expect(try back.first?.fileAttachments.first?.readAll() == bytes)
        #expect(try back.first?.fileAttachments.last?.readAll() == [7, 7, 7])
        #expect(await eventually(timeout: 10) { Self.heldFiles(daemon.pid, files.path).isEmpty },
                "\(Self.heldFiles(daemon.pid, files.path))")
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func hostileDescriptorsAreClosedWithTheirClientOnly() async throws {
        let daemon = try await DaemonProcess(extraConfig: "<key>MaxDescriptorsPerClient</key><integer>4</integer>")
        defer { daemon.remove() }
        let files = try TemporaryFolder()
        try SDKHost.writeFile("\(files.path)/f", [1, 2, 3], mode: 0o600)
        func openFiles(_ n: Int) -> [Int32] { (0..<n).map { _ in open("\(files.path)/f", O_RDONLY | O_CLOEXEC) } }
        func begin(_ fds: Int, files: [Int]) -> [UInt8] {
            var plist: [String: PlistValue] = ["type": "begin", "id": .string(RequestID().uuidString), "extension": "com.example.echo",
                                               "items": [["files": .array(files.map { .integer(Int64($0)) })]]]
            plist["fds"] = .integer(Int64(fds))
            return try! Frame.encode(.dictionary(plist))
        }
        // A well-behaved client, connected throughout: none of the others may disturb it.
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        let echo = try host.extension(identifier: "com.example.echo")

        var pipeFDs: [Int32] = [-1, -1]
        #expect(pipe(&pipeFDs) == 0)
        let attacks: [(String, [UInt8], [Int32])] = [
            ("claims two, brings one", begin(2, files: [0, 1]), openFiles(1)),
            ("a pipe", begin(1, files: [0]), [pipeFDs[0]]),
            ("descriptors on a ping", try Frame.encode(Message.ping(seq: 1).plist), openFiles(2)),
            ("an index past its descriptors", begin(1, files: [3]), openFiles(1)),
        ]
        for (what, frame, fds) in attacks {
            let client = try HostileClient(daemon.socket)
            client.handshake()
            _ = client.receive()  // connected
            client.write(frame, descriptors: fds)
            #expect(client.isClosedByDaemon(), "\(what): the daemon kept the client")
            for fd in fds { close(fd) }
            #expect(try await echo.perform([ExtensionItem(title: what)]).first?.title == what)
        }
        close(pipeFDs[1])

        // Past MaxDescriptorsPerClient: the request ends overloaded, the client stays.
        let greedy = try HostileClient(daemon.socket)
        greedy.handshake()
        _ = greedy.receive()
        let fds = openFiles(5)
        let frame = begin(5, files: [0, 1, 2, 3, 4])
        greedy.write(frame, descriptors: fds)
        for fd in fds { close(fd) }
        let refused = greedy.receive()
        if case .interrupted(_, let reason)? = refused {
            #expect(InterruptionReason(plist: reason) == .overloaded)
        } else {
            Issue.record("expected overloaded, got \(String(describing: refused))")
        }
        #expect(await eventually(timeout: 10) { Self.heldFiles(daemon.pid, files.path).isEmpty },
                "\(Self.heldFiles(daemon.pid, files.path))")
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }


    /// More descriptors in one sendmsg than a message may carry (which our own shim refuses to send): the daemon
    /// sees the kernel cut them, tells the client why, drops it and keeps none.
    @Test(.enabled(if: python3 != nil, "needs python3"))
    func seventyDescriptorsAtOnceAreRefused() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let files = try TemporaryFolder()
        try SDKHost.writeFile("\(files.path)/f", [1], mode: 0o600)
        let connect = try Frame.encode(Message.connect(version: protocolVersion).plist)
        let begin = try Frame.encode(Message.begin(id: RequestID(), items: [], extensionID: "com.example.echo").plist)
        writeFile("\(files.path)/attack.py", """
            import socket, sys, os
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sys.argv[1])
            s.sendall(bytes.fromhex(sys.argv[2]))
            s.recv(65536)
            fds = [os.open(sys.argv[4], os.O_RDONLY) for _ in range(70)]
            socket.send_fds(s, [bytes.fromhex(sys.argv[3])], fds)
            s.settimeout(15)
            told, closed = b"", False
            try:
                while not closed:
                    chunk = s.recv(65536)
                    told += chunk
                    closed = chunk == b""
            except ConnectionResetError:
                closed = True
            except socket.timeout:
                pass
            print(("closed" if closed else "open") + (", told why" if b"bad input" in told else ""))
            """)
        let hex = { (b: [UInt8]) in b.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined() }
        let out = "\(files.path)/out"
        let pid = spawnProgram([try #require(python3), "\(files.path)/attack.py", daemon.socket, hex(connect), hex(begin), "\(files.path)/f"],
                               stdout: out)
        #expect(await waitExit(pid) == 0)
        // Told why (an `error` frame), then closed.
        #expect(readSmallFile(out)?.contains("closed, told why") == true, "\(readSmallFile(out) ?? "")")
        #expect(await eventually(timeout: 10) { Self.heldFiles(daemon.pid, files.path).isEmpty })
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        #expect(try await host.extension(identifier: "com.example.echo").perform([ExtensionItem(title: "on")]).first?.title == "on")
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }
}
