// `sdk-host conformance <extension-id> [--config P]`: drives one extension's worker through the real host (the
// launcher, its sandbox, the engine) and checks that it speaks the worker protocol (docs/PROTOCOL.md): the
// handshake, echo of every value kind, heartbeats while a request waits, cancel within the grace, partial results
// within credit, descriptors both ways, a host call, a message type it cannot know, a malformed and an oversized
// frame, and idle exit. One line per check, then "N passed, N failed"; exit 0 only if every check passed.
//
// The worker runs with SDKHOST_CONFORMANCE=1: a request whose first item is titled `sdkhost.conformance` is then
// answered by its runtime, whatever the extension's own handler does (docs/PROTOCOL.md "Conformance"). The
// host's timings are shortened so that the run takes seconds: heartbeats every 0.1 s, a cancel grace of 1.5 s.
import SDKHost
import SDKPosix
import SDKWire
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

enum ConformanceCommand {
    static let usage = """
        usage: sdk-host conformance <extension-id> [--config PATH]
          --config PATH   the configuration whose extensions to search (as for request --embedded)
        Runs the worker protocol's conformance checks against the extension's worker, through an embedded host
        under the extension's own sandbox, and prints one line per check, then "N passed, N failed".
        Exit status 0 when every check passed, 1 when one failed, 2 usage or configuration error (unknown
        extension, bad manifest).
        """

    /// The host service the `host call` check provides; listed for the extension for this run only.
    static let service = "sdkhost.conformance"

    static func run(_ arguments: [String]) -> Never {
        let options = Options(arguments, valued: ["--config"], boolean: [], usage: usage)
        guard options.positionals.count == 1 else {
            fail(options.positionals.isEmpty ? "missing extension identifier" : "unexpected argument '\(options.positionals[1])'",
                 status: ExitStatus.usage, usage: usage)
        }
        EmbeddedHost.configure(from: options)
        let identifier = options.positionals[0]
        let passed = runAsync { await Suite(identifier: identifier).run() }
        exit(passed ? ExitStatus.success : ExitStatus.failure)
    }
}


/// One run of the checks against one extension.
private final class Suite: Sendable {
    let identifier: String
    private let events = Mutex<[WorkerEvent]>([])
    private let tally = Mutex<(passed: Int, failed: Int)>((0, 0))

    init(identifier: String) { self.identifier = identifier }

    /// The host every check but `idle exit` uses: one worker, long idle, no deadline, heartbeats every 0.1 s.
    static func host(idleSeconds: Double) -> ExtensionHost {
        EmbeddedHost.make(logLevel: .error) { c in
            c.heartbeatIntervalSeconds = 0.1
            c.heartbeatTimeoutSeconds = 1.5
            c.cancelGracePeriodSeconds = 1.5
            c.workerEnvironment.append("SDKHOST_CONFORMANCE=1")
            c.adjustPolicy = { p in
                p.maxWorkers = 1
                p.minWarmWorkers = 0
                p.maxConcurrentRequests = max(p.maxConcurrentRequests, 4)
                p.idleTimeoutSeconds = idleSeconds
                p.requestDeadlineSeconds = nil
                p.maxRequestsPerWorker = nil
                p.maxWorkerRSSMB = nil
                p.restartLimitBurst = 1000
                p.hostServices.insert(ConformanceCommand.service)
            }
        }
    }

    func run() async -> Bool {
        let host = Self.host(idleSeconds: 300)
        let ext: Extension
        do {
            ext = try host.extension(identifier: identifier)
        } catch {
            await host.shutdown()
            fail("\(error)", status: ExitStatus.usage)
        }
        let watcher = watch(host)
        print("conformance of \(identifier) (docs/PROTOCOL.md), through an embedded host under its sandbox")
        let pid = await handshake(ext)
        if pid == nil { await showStartFailure(host) }
        if let pid {
            await echo(ext)
            await heartbeatAndCancel(ext, pid: pid)
            await stream(ext)
            await descriptors(ext)
            await hostCall(ext)
            await unknownMessage(host, ext)
            await badFrame(host, ext, name: "malformed frame", bytes: [0, 0, 0, 12] + Array("not a bplist".utf8),
                           what: "a frame whose payload is not a property list")
            await badFrame(host, ext, name: "oversized frame", bytes: [0x7F, 0xFF, 0xFF, 0xF0],
                           what: "a frame header announcing 2 GiB")
        } else {
            for name in ["echo", "heartbeat", "cancel", "partial results and credit", "descriptors", "host call",
                         "unknown message", "malformed frame", "oversized frame"] {
                report(name, false, "not run: no handshake")
            }
        }
        await host.shutdown()
        watcher.cancel()
        if pid != nil { await idleExit() } else { report("idle exit", false, "not run: no handshake") }
        let (passed, failed) = tally.withLock { $0 }
        print("\(passed) passed, \(failed) failed")
        return failed == 0
    }

    // MARK: Checks

    func handshake(_ ext: Extension) async -> pid_t? {
        let start = monotonicSeconds()
        let outcome = await within(15) { try await ext.prewarm() }
        switch outcome {
        case .success(let pid):
            report("handshake", true, "worker \(pid) answered hello with welcome (version \(protocolVersion)) in \(milliseconds(since: start))")
            return pid
        case .failure(let why):
            report("handshake", false, why)
            return nil
        }
    }

    /// A worker that died before its handshake (a script that does not import, say): the end of its stderr, from
    /// the crash report, so that the author sees why.
    func showStartFailure(_ host: ExtensionHost) async {
        guard let report = await host.crashReportsInMemory().last(where: { $0.extensionIdentifier == identifier }),
            !report.stderrTail.isEmpty
        else { return }
        let lines = report.stderrTail.split(separator: "\n").suffix(12)
        print("      the worker's stderr, last \(lines.count) line(s):")
        for line in lines { print("      | " + String(line).displaySafe()) }
    }

    func echo(_ ext: Extension) async {
        let sent = [Self.command("echo"), ExtensionItem(
            title: "every kind ✓", text: "text\nwith lines",
            attachments: [.string("s"), .string(""), .integer(-42), .integer(Int64.max), .integer(Int64.min), .real(3.25),
                          .real(-0.5e-300), .bool(true), .bool(false), .data([0, 1, 2, 0xFF]), .data([]),
                          .date(PlistDate(secondsSinceReferenceDate: 812_345_678)), .array([.string("a"), .array([])]),
                          .dictionary(["k": .string("v"), "n": .dictionary([:])])],
            userInfo: ["nested": .dictionary(["list": .array([.integer(1), .real(2.5)])]), "empty": .string("")])]
        switch await within(15, { try await ext.perform(sent) }) {
        case .success(let items) where items == sent:
            report("echo", true, "\(sent.count) items with every value kind came back unchanged")
        case .success(let items):
            report("echo", false, "came back changed: \(items.map(\.description).joined(separator: "; "))")
        case .failure(let why):
            report("echo", false, why)
        }
    }

    func heartbeatAndCancel(_ ext: Extension, pid: pid_t) async {
        let task = ext.start([Self.command("wait")])
        let ended = Mutex<RequestOutcome?>(nil)
        let outcomeWatcher = Task { let outcome = await task.outcome; ended.withLock { $0 = outcome } }
        // Heartbeat: 3 s of a request that waits, pinged every 0.1 s, with 1.5 s to answer each: a worker that
        // answers none is killed at about 1.6 s, well inside the 3 s even on a loaded machine.
        let held = 3.0
        try? await Task.sleep(for: .seconds(held))
        let early = ended.withLock { $0 }
        let died = exitEvent(pid)
        if let died {
            report("heartbeat", false, "the worker was ended while a request waited: \(died)")
        } else if let early {
            report("heartbeat", false, "the waiting request ended on its own: \(early)")
        } else {
            report("heartbeat", true, "answered pings every 0.1 s for \(held) s while a request waited")
        }
        // Cancel: the host cancels the waiting request; the worker must answer within the grace (1.5 s), not be
        // killed for ignoring it, and serve the next request.
        task.cancel()
        _ = await outcomeWatcher.value
        let outcome = ended.withLock { $0 }
        try? await Task.sleep(for: .seconds(2.0))
        if let died = exitEvent(pid) {
            report("cancel", false, "the worker did not answer the cancel within the grace and was ended: \(died)")
        } else if case .cancelled? = outcome, await servedBy(ext, pid) {
            report("cancel", true, "answered the host's cancel within the grace; the same worker served the next request")
        } else {
            report("cancel", false, "the request ended \(outcome.map { "\($0)" } ?? "never"), or the worker served no request after it")
        }
    }

    func stream(_ ext: Extension) async {
        let count = 40
        let collected = Mutex<[[ExtensionItem]]>([])
        let outcome = await within(30) {
            try await ext.perform([Self.command("stream:\(count)")]) { batch in
                // The first 20 slowly: the worker must wait for credit, never run more than 16 ahead.
                let taken = collected.withLock { $0.append(batch); return $0.count }
                if taken <= 20 { usleep(20_000) }
            }
        }
        let batches = collected.withLock { $0 }
        let texts = batches.map { $0.map { $0.text ?? "" }.joined(separator: ",") }
        switch outcome {
        case .success(let final) where texts == (1...count).map(String.init) && final.map(\.text) == ["\(count)"]:
            report("partial results and credit", true, "\(count) partial results in order, within 16 un-credited, then the completion")
        case .success(let final):
            report("partial results and credit", false, "got \(texts.count) partial results [\(texts.prefix(5).joined(separator: " "))...] and \(final.map { $0.text ?? "-" })")
        case .failure(let why):
            report("partial results and credit", false, "after \(batches.count) partial results: \(why)")
        }
    }

    func descriptors(_ ext: Extension) async {
        let small = Array("hello, conformance".utf8)
        let large = (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let attachments: [FileAttachment]
        do {
            attachments = [try FileAttachment(bytes: small, name: "conformance-small"),
                           try FileAttachment(bytes: large, name: "conformance-large")]
        } catch {
            return report("descriptors", false, "cannot make the files to send: \(error)")
        }
        let sent = [Self.command("files"), ExtensionItem(fileAttachments: [attachments[0]]),
                    ExtensionItem(fileAttachments: [attachments[1]])]
        switch await within(15, { try await ext.perform(sent) }) {
        case .success(let items):
            let files = items.flatMap(\.fileAttachments)
            let contents = files.map { (try? $0.readAll()) ?? [] }
            if items.count == 1, items[0].title == "files", contents == [Array(small.reversed()), Array(large.reversed())] {
                report("descriptors", true, "2 files in (18 B and 100 kB), 2 new files out with their bytes reversed")
            } else {
                report("descriptors", false, "expected one item \"files\" with 2 files reversed; got \(items.count) items, "
                    + "\(files.count) files of \(contents.map { "\($0.count) B" }.joined(separator: ", "))")
            }
        case .failure(let why):
            report("descriptors", false, why)
        }
    }

    func hostCall(_ ext: Extension) async {
        let asked = Mutex<[ExtensionItem]?>(nil)
        do {
            try ext.registerService(ConformanceCommand.service) { call in
                asked.withLock { $0 = call.items }
                return [ExtensionItem(text: "pong")]
            }
        } catch {
            return report("host call", false, "\(error)")
        }
        defer { ext.removeService(ConformanceCommand.service) }
        switch await within(15, { try await ext.perform([Self.command("call:\(ConformanceCommand.service)")]) }) {
        case .success(let items) where items.map(\.text) == ["pong"] && asked.withLock({ $0?.map(\.text) }) == ["ping"]:
            report("host call", true, "called \(ConformanceCommand.service) with \"ping\" and completed with its \"pong\"")
        case .success(let items):
            report("host call", false, "the service saw \(asked.withLock { $0?.map { $0.text ?? "-" } ?? [] }), the request completed with \(items.map { $0.text ?? "-" })")
        case .failure(let why):
            report("host call", false, why)
        }
    }

    func unknownMessage(_ host: ExtensionHost, _ ext: Extension) async {
        guard case .success(let pid) = await within(15, { try await ext.prewarm() }) else {
            return report("unknown message", false, "no worker to send it to")
        }
        let frame = (try? Frame.encode(.dictionary(["type": .string("sdkhost.conformance.future"), "note": .string("a later version's message")]))) ?? []
        guard await sendRaw(host, frame, to: pid) else { return report("unknown message", false, "worker \(pid) is gone") }
        try? await Task.sleep(for: .milliseconds(300))
        if let died = exitEvent(pid) {
            report("unknown message", false, "the worker ended on a message type it does not know: \(died)")
        } else if await servedBy(ext, pid) {
            report("unknown message", true, "ignored a message of an unknown type and served the next request")
        } else {
            report("unknown message", false, "the worker served no request after a message of an unknown type")
        }
    }

    /// Sends `bytes` to a ready worker; it must exit on its own (an exit status, not a signal) within 5 s.
    func badFrame(_ host: ExtensionHost, _ ext: Extension, name: String, bytes: [UInt8], what: String) async {
        guard case .success(let pid) = await within(15, { try await ext.prewarm() }) else {
            return report(name, false, "no worker to send it to")
        }
        guard await sendRaw(host, bytes, to: pid) else { return report(name, false, "worker \(pid) is gone") }
        let start = monotonicSeconds()
        switch await exit(of: pid, within: 5).map({ $0.reason ?? .exited(0) }) {
        case nil: report(name, false, "still running 5 s after \(what)")
        case .signal(let signal)?: report(name, false, "died of signal \(signal) on \(what) (it must exit)")
        case let reason?:
            if case .exited(let status) = reason, status == 2 {
                report(name, true, "exited with status 2 \(milliseconds(since: start)) after \(what)")
            } else if case .exited(let status) = reason {
                report(name, false, "exited with status \(status) after \(what); a protocol error from the host is exit 2")
            } else {
                report(name, false, "ended with \(reason) after \(what) (it must exit on its own)")
            }
        }
    }

    /// A host that retires idle workers after 0.5 s: the worker must exit when the host closes its connection.
    func idleExit() async {
        events.withLock { $0.removeAll() }  // the first host's: a reused pid must not match an older worker's exit
        let host = Self.host(idleSeconds: 0.5)
        let watcher = watch(host)
        defer { watcher.cancel() }
        guard let ext = try? host.extension(identifier: identifier),
            case .success(let pid) = await within(15, { try await ext.prewarm() })
        else {
            await host.shutdown()
            return report("idle exit", false, "no worker started")
        }
        let start = monotonicSeconds()
        let gone = await exit(of: pid, within: 5)
        await host.shutdown()
        switch gone {
        case nil: report("idle exit", false, "still running 5 s into a 0.5 s idle timeout")
        case let event? where event.reason == nil:
            report("idle exit", true, "exited when the host retired it after 0.5 s idle (\(milliseconds(since: start)) after its handshake)")
        case let event?: report("idle exit", false, "did not exit when the host closed its connection: \(event.reason.map { "\($0)" } ?? "")")
        }
    }

    // MARK: Helpers

    /// An item that the runtime answers itself in conformance mode.
    static func command(_ text: String) -> ExtensionItem { ExtensionItem(title: "sdkhost.conformance", text: text) }

    func report(_ name: String, _ passed: Bool, _ detail: String) {
        tally.withLock { passed ? ($0.passed += 1) : ($0.failed += 1) }
        let padded = name + String(repeating: " ", count: max(1, 28 - name.count))
        // The detail may hold what the worker sent (an error's text): one line, escaped.
        print("\(passed ? "pass" : "FAIL")  \(padded)" + detail.displaySafe())
    }

    /// Collects the host's worker events for the checks to look at.
    func watch(_ host: ExtensionHost) -> Task<Void, Never> {
        let stream = host.workerEvents()
        return Task { [self] in
            for await event in stream { events.withLock { $0.append(event) } }
        }
    }

    /// Why worker `pid` ended, if it did (an exit with no reason is shown as a clean exit).
    func exitEvent(_ pid: pid_t) -> InterruptionReason? { exitedEvent(pid).map { $0.reason ?? .exited(0) } }

    /// The event of worker `pid`'s end, if it has ended.
    func exitedEvent(_ pid: pid_t) -> WorkerEvent? { events.withLock { $0.last { $0.pid == pid && $0.kind == .exited } } }

    /// The event of worker `pid`'s end, waiting up to `seconds` for it.
    func exit(of pid: pid_t, within seconds: Double) async -> WorkerEvent? {
        let start = monotonicSeconds()
        while exitedEvent(pid) == nil, monotonicSeconds() - start < seconds { try? await Task.sleep(for: .milliseconds(20)) }
        return exitedEvent(pid)
    }

    /// Whether an echo request now runs on worker `pid`.
    func servedBy(_ ext: Extension, _ pid: pid_t) async -> Bool {
        let task = ext.start([Self.command("echo")])
        guard case .completed = await within(15, { await task.outcome }).value else {
            task.cancel()
            return false
        }
        return task.pid == pid
    }

    func sendRaw(_ host: ExtensionHost, _ bytes: [UInt8], to pid: pid_t) async -> Bool {
        await withCheckedContinuation { continuation in
            host.engine.sendRaw(bytes, toWorker: pid) { continuation.resume(returning: $0) }
        }
    }

    /// `body`'s value, or why there is none: what it threw, or that it took more than `seconds`. Returns at the
    /// timeout even if `body` does not honour cancellation (a request's outcome does not): `body`'s Task is
    /// cancelled and left to end with the host.
    func within<T: Sendable>(_ seconds: Double, _ body: @escaping @Sendable () async throws -> T) async -> Outcome<T> {
        let first = FirstOutcome<T>()
        return await withCheckedContinuation { continuation in
            first.wait(with: continuation)
            let work = Task {
                do { first.settle(.success(try await body())) } catch { first.settle(.failure("\(error)")) }
            }
            Task {
                try? await Task.sleep(for: .seconds(seconds))
                work.cancel()
                first.settle(.failure("no answer in \(Int(seconds)) s"))
            }
        }
    }

    /// Resumes its continuation with the first outcome it is given, and ignores the rest.
    final class FirstOutcome<T: Sendable>: Sendable {
        private let continuation = Mutex<CheckedContinuation<Outcome<T>, Never>?>(nil)
        func wait(with c: CheckedContinuation<Outcome<T>, Never>) { continuation.withLock { $0 = c } }
        func settle(_ outcome: Outcome<T>) {
            continuation.withLock { c -> CheckedContinuation<Outcome<T>, Never>? in
                defer { c = nil }
                return c
            }?.resume(returning: outcome)
        }
    }

    enum Outcome<T: Sendable>: Sendable {
        case success(T)
        case failure(String)
        var value: T? { if case .success(let v) = self { v } else { nil } }
    }

    func monotonicSeconds() -> Double { Double(monotonicNanoseconds()) / 1e9 }

    func milliseconds(since start: Double) -> String { "\(Int((monotonicSeconds() - start) * 1000)) ms" }
}
