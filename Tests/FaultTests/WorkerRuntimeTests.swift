// The worker runtime seen from the socket, with the test as the host: Echo (a real extension process, spawned
// directly with its socket on fd 3) gets a burst of frames in one write and must answer every request in it.
// Its replies are held while it handles one read's frames and leave in batches; none may be lost, neither at a
// batch's edge nor when the read ends in a frame that makes it exit.
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct WorkerRuntimeTests {
    /// Reads `fd` (non-blocking) until end-of-file or `timeout` seconds.
    func readToEnd(_ fd: Int32, timeout: Double = 30) -> [UInt8] {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
        while monotonicNanoseconds() < deadline {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 100) >= 0 || errno == EINTR else { break }
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }  // both ends are non-blocking
            if n == 0 { break }
            if n > 0 { bytes += buffer[0..<n] }
        }
        return bytes
    }

    @Test func aBurstOfRequestsIsAnsweredInFullEvenWhenItEndsInAProtocolError() throws {
        let echo = "\(try #require(currentExecutableDirectory()))/Echo"
        let ids = (0..<21).map { _ in RequestID() }
        var burst = try Frame.encode(Message.hello(version: protocolVersion, identifier: "com.example.echo",
                                                   hostPid: getpid(), idleTimeoutMs: 0).plist)
        for (n, id) in ids.enumerated() {
            burst += try Frame.encode(Message.begin(id: id, items: [ExtensionItem(title: "item \(n)")]).plist)
        }
        // A frame whose length is right and whose contents are not a property list: the worker must exit.
        let garbage = Array("not a plist".utf8)
        burst += [0, 0, 0, UInt8(garbage.count)] + garbage
        let channels = try spawnWithChannels(SpawnRequest(
            path: echo, arguments: [echo],
            environment: ["SDKHOST_IPC_FD=3", "SDKHOST_EXTENSION_ID=com.example.echo"]))
        let written = burst.withUnsafeBytes { send(channels.socket.rawValue, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        #expect(written == burst.count)
        let replies = readToEnd(channels.socket.rawValue)
        let status = try waitForExit(channels.process)
        let stderr = String(decoding: readToEnd(channels.stderr.rawValue, timeout: 5), as: UTF8.self)
        channels.close()

        var reader = FrameReader()
        replies.withUnsafeBytes { reader.append($0) }
        var messages: [Message] = []
        while let value = try reader.nextValue() { messages.append(try Message(plist: value)) }
        guard case .welcome = messages.first else {
            Issue.record("the first reply is not a welcome: \(messages.first.map(\.typeName) ?? "none")")
            return
        }
        let completed = messages.dropFirst().compactMap { message -> RequestID? in
            if case .complete(let id, let items) = message, let n = ids.firstIndex(of: id),
                items == [ExtensionItem(title: "item \(n)")]
            {
                return id
            }
            return nil
        }
        #expect(completed == ids, "every request of the burst is completed, in order (\(completed.count) of \(ids.count))")
        #expect(messages.count == ids.count + 1, "\(messages.map(\.typeName))")
        #expect(status == .exited(2))
        #expect(stderr.contains("protocol error from host"), "\(stderr)")
    }

    /// Protocol 2 added host services: a runtime of one version and a host of another refuse each other at the
    /// handshake, each saying which versions met.
    @Test func aHelloOfAnotherProtocolVersionEndsTheWorkerClearly() throws {
        let echo = "\(try #require(currentExecutableDirectory()))/Echo"
        let hello = try Frame.encode(Message.hello(version: 1, identifier: "com.example.echo", hostPid: getpid(), idleTimeoutMs: 0).plist)
        let channels = try spawnWithChannels(SpawnRequest(
            path: echo, arguments: [echo], environment: ["SDKHOST_IPC_FD=3", "SDKHOST_EXTENSION_ID=com.example.echo"]))
        _ = hello.withUnsafeBytes { send(channels.socket.rawValue, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        let replies = readToEnd(channels.socket.rawValue)
        let status = try waitForExit(channels.process)
        let stderr = String(decoding: readToEnd(channels.stderr.rawValue, timeout: 5), as: UTF8.self)
        channels.close()
        #expect(replies.isEmpty, "no welcome to a host of another version")
        #expect(status == .exited(2))
        #expect(stderr.contains("host speaks protocol 1, we speak \(protocolVersion)"), "\(stderr)")
    }

    @Test func aWorkerOfAnotherProtocolVersionIsRefusedAtItsWelcome() async throws {
        try await withHost({ $0.workerEnvironment = ["CRASHER_FAULT_AT_START=welcome-v1"] }) { host, log in
            let (crasher, recorder) = try recordedExtension(host, "com.example.crasher")
            let id = crasher.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
            let outcome = await recorder.wait(for: id)
            guard case .interrupted(.protocolViolation(let detail))? = outcome else {
                Issue.record("\(String(describing: outcome))")
                return
            }
            #expect(detail.contains("the worker speaks protocol 1; this host speaks \(protocolVersion)"), "\(detail)")
            #expect(log.contains("rebuild the extension"), "\(log.all)")
        }
    }

    @Test func theWelcomeIsWrittenBeforeAnInlineHandlerReadWithTheHelloCanCrash() throws {
        // A worker that dies before its welcome reaches the host died "before its handshake", and the host sends
        // its requests to the next worker: a request that crashes its worker would run up to three times. The
        // hello and a crashing begin arrive in one write, so the reader handles both in one batch.
        let crasher = "\(try #require(currentExecutableDirectory()))/Crasher"
        let id = RequestID()
        var burst = try Frame.encode(Message.hello(version: protocolVersion, identifier: "com.example.crasher",
                                                   hostPid: getpid(), idleTimeoutMs: 0).plist)
        burst += try Frame.encode(Message.begin(id: id, items: [ExtensionItem(title: "segv")]).plist)
        let channels = try spawnWithChannels(SpawnRequest(
            path: crasher, arguments: [crasher],
            environment: ["SDKHOST_IPC_FD=3", "SDKHOST_EXTENSION_ID=com.example.crasher", "CRASHER_INLINE=1"]))
        let written = burst.withUnsafeBytes { send(channels.socket.rawValue, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        #expect(written == burst.count)
        let replies = readToEnd(channels.socket.rawValue)
        let status = try waitForExit(channels.process)
        channels.close()
        var reader = FrameReader()
        replies.withUnsafeBytes { reader.append($0) }
        var messages: [Message] = []
        while let value = try reader.nextValue() { messages.append(try Message(plist: value)) }
        #expect(status == .signaled(SIGSEGV), "the inline handler crashed the worker")
        guard case .welcome? = messages.first else {
            Issue.record("no welcome before the crash: \(messages.map(\.typeName))")
            return
        }
    }
}
