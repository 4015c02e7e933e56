// The engine's rare error paths, made deterministic through its seams: a launcher whose spawn fails, one whose
// reap loses the status (an app that ignores SIGCHLD), one whose exit descriptor cannot be watched; and what a
// request leaves behind after it ends in a queue, by a cancel or a deadline, or as `overloaded`.
import SDKWire
import HostTestSupport
@testable import SDKHost
import SDKPosix
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Fails every spawn.
struct FailingLauncher: WorkerLauncher {
    func launch(_ request: SpawnRequest) throws(SystemError) -> LaunchedWorker {
        throw SystemError("posix_spawn", errno: EAGAIN, detail: request.path)
    }
}

/// Real processes whose child is wrapped: `reapFails` reaps for real but reports ECHILD, as when the app
/// ignores SIGCHLD and the kernel discards the status; `unwatchable` hands the engine a descriptor epoll refuses.
struct WrappingLauncher: WorkerLauncher {
    var reapFails = false
    var unwatchable = false

    func launch(_ request: SpawnRequest) throws(SystemError) -> LaunchedWorker {
        var launched = try PosixLauncher().launch(request)
        launched.child = WrappedChild(launched.child, reapFails: reapFails, unwatchable: unwatchable)
        // These tests are about the exit descriptor and the reap: no exit notice ends a request before them.
        launched.exitNotice = nil
        return launched
    }
}

final class WrappedChild: WorkerChild {
    let inner: any WorkerChild
    let reapFails: Bool
    let regularFile: Int32?
    static let reaped = Mutex<[pid_t]>([])

    init(_ inner: any WorkerChild, reapFails: Bool, unwatchable: Bool) {
        self.inner = inner
        self.reapFails = reapFails
        // A regular file: epoll_ctl refuses it with EPERM.
        regularFile = unwatchable ? open("/proc/self/status", O_RDONLY | O_CLOEXEC) : nil
    }

    var pid: pid_t { inner.pid }
    var exitDescriptor: Int32 { regularFile ?? inner.exitDescriptor }
    func signal(_ signal: Int32) { inner.signal(signal) }
    func signalWorker(_ pid: pid_t, ifChild isChild: () -> Bool) -> Bool { inner.signalWorker(pid, ifChild: isChild) }
    func reap() throws(SystemError) -> SDKPosix.ExitStatus? {
        guard let status = try inner.reap() else { return nil }
        Self.reaped.withLock { $0.append(pid) }
        if reapFails { throw SystemError("waitid(P_PIDFD)", errno: ECHILD) }
        return status
    }
    func close() {
        if let regularFile { Glibc.close(regularFile) }
        inner.close()
    }
}

/// Something to hold weakly: alive as long as a request's handler captures it.
final class Canary: Sendable {}

@Suite(.serialized) struct EngineSeamTests {
    @Test func spawnFailureEndsTheRequestWithTheReason() async throws {
        try await withHost({ $0.launcher = FailingLauncher() }) { host, log in
            let (ext, recorder) = try recordedExtension(host, "com.example.echo")
            let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "x")])
            guard case .interrupted(.launchFailed(let detail)) = await recorder.wait(for: id) else {
                Issue.record("not launchFailed")
                return
            }
            #expect(detail.contains("posix_spawn") && detail.contains("Echo"))
            #expect(log.contains("cannot launch worker"))
        }
    }

    @Test func aLostExitStatusStillEndsTheWorkerAndShutdownReturns() async throws {
        try await withHost({ $0.launcher = WrappingLauncher(reapFails: true) }) { host, log in
            let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
            let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "exit")])
            // The status is gone, so the reason cannot name it; what matters is one outcome, no spin, no hang.
            #expect(await recorder.wait(for: id) == .interrupted(.exited(-1)))
            #expect(log.contains("status is unavailable"))
            let next = ext.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
            #expect(await recorder.wait(for: next) == .completed([ExtensionItem(title: "echo")]))
        }
    }

    @Test func aWorkerThatCannotBeWatchedIsKilledAndReaped() async throws {
        WrappedChild.reaped.withLock { $0.removeAll() }
        try await withHost({ $0.launcher = WrappingLauncher(unwatchable: true) }) { host, log in
            let (ext, recorder) = try recordedExtension(host, "com.example.echo")
            let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "x")])
            guard case .interrupted(.launchFailed(let detail)) = await recorder.wait(for: id) else {
                Issue.record("not launchFailed")
                return
            }
            #expect(detail.contains("cannot watch"))
            #expect(await eventually { WrappedChild.reaped.withLock { $0.count } == 1 }, "reaped by polling")
            #expect(log.contains("cannot watch worker"))
        }
    }

    /// A host whose crasher runs one request at a time on one worker, so everything after the first queues.
    func withSingleSlotHost(
        _ tweak: @escaping (inout HostConfiguration) -> Void = { _ in },
        _ body: (ExtensionHost, Extension) async throws -> Void
    ) async throws {
        let temp = TemporaryExtension(identifier: "com.example.single", executable: "Crasher", policy: """
            <key>MaxWorkers</key><integer>1</integer><key>MaxConcurrentRequests</key><integer>1</integer>
            """)
        defer { temp.remove() }
        try await withHost(extraSearchPaths: [temp.root], tweak) { host, _ in
            try await body(host, try host.extension(identifier: "com.example.single"))
        }
    }

    /// Starts a request on the engine directly, with a handler that captures a canary.
    func submit(_ host: ExtensionHost, _ title: String, deadline: Double? = nil,
                _ done: @escaping @Sendable (RequestID, RequestOutcome) -> Void) -> (RequestID, WeakBox) {
        let canary = Canary()
        let id = RequestID()
        host.engine.submit(SubmittedRequest(
            id: id, extensionID: "com.example.single",
            items: [ExtensionItem(title: title, attachments: [.data([UInt8](repeating: 1, count: 4096))])],
            deadline: deadline, onWorkerAssigned: nil,
            deliver: { [canary] outcome in withExtendedLifetime(canary) { done(id, outcome) } }))
        return (id, WeakBox(canary))
    }

    @Test func cancelledAndTimedOutQueuedRequestsLeaveNothingBehind() async throws {
        try await withSingleSlotHost { host, ext in
            let recorder = Recorder()
            recorder.attach(to: ext)
            let blocker = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:5000")], deadline: 30)
            #expect(await eventually { ext.pid(for: blocker) != nil })
            // 1000 queued requests: half cancelled by the app, half ended by their deadline, all while queued.
            let outcomes = Mutex<[RequestID: [RequestOutcome]]>([:])
            var requests: [(id: RequestID, timedOut: Bool, canary: WeakBox)] = []
            for i in 0..<1000 {
                let timedOut = i % 2 == 1
                let (id, canary) = submit(host, "queued", deadline: timedOut ? 0.2 : nil) { id, outcome in
                    outcomes.withLock { $0[id, default: []].append(outcome) }
                }
                requests.append((id, timedOut, canary))
            }
            for r in requests where !r.timedOut { host.engine.cancel(r.id) }
            #expect(await eventually { outcomes.withLock { $0.count } == 1000 })
            let all = outcomes.withLock { $0 }
            for r in requests {
                #expect(all[r.id] == [r.timedOut ? .interrupted(.timedOut) : .cancelled(.cancelledByHost)])
            }
            #expect(await eventually { requests.allSatisfy { $0.canary.value == nil } }, "no handler is retained")
            let snapshot = try #require(await host.status())
            #expect(snapshot.queuedRequests == 0)
            #expect(snapshot.activeRequests == 1, "only the blocker is left")
            #expect(snapshot.totals.spawns == 1, "no worker was touched for the queued ones")
            let timers = await withCheckedContinuation { c in host.engine.loop.execute { c.resume(returning: host.engine.loop.pendingTimerCount) } }
            #expect(timers < 10, "no timer left behind by the 1000 ended requests (\(timers) pending)")
            ext.cancelRequest(blocker)
            #expect(await recorder.wait(for: blocker) == .cancelled(.cancelledByHost))
        }
    }

    /// A daemon client may name any extension: requests for 500 that are not installed, each name 4 KB, each end
    /// `launchFailed` once, and leave no counters (nor status entries) behind: a tally each grew without bound.
    @Test func requestsForExtensionsNotInstalledLeaveNothingPerName() async throws {
        try await withHost { host, _ in
            let before = try #require(await host.status())
            let outcomes = Mutex<[RequestID: [RequestOutcome]]>([:])
            for i in 0..<500 {
                let id = RequestID()
                host.engine.submit(SubmittedRequest(
                    id: id, extensionID: "com.example.absent.\(i)." + String(repeating: "x", count: 4096),
                    items: [ExtensionItem(title: "x")], deadline: nil, onWorkerAssigned: nil,
                    deliver: { outcome in outcomes.withLock { $0[id, default: []].append(outcome) } }))
            }
            #expect(await eventually { outcomes.withLock { $0.count } == 500 })
            for (_, ended) in outcomes.withLock({ $0 }) {
                guard ended.count == 1, case .interrupted(.launchFailed(let detail)) = ended[0] else {
                    Issue.record("not one launchFailed: \(ended.map { "\($0)".prefix(80) })")
                    continue
                }
                #expect(detail.hasPrefix("unknown extension com.example.absent."))
            }
            let after = try #require(await host.status())
            #expect(after.extensions.count == before.extensions.count, "\(after.extensions.count) extensions listed")
            #expect(!after.extensions.contains { $0.identifier.hasPrefix("com.example.absent.") })
            #expect(after.totals == before.totals)
        }
    }

    /// The most output the host has queued for one of its workers, read on its loop.
    func mostOutputQueued(_ host: ExtensionHost) async -> Int {
        await withCheckedContinuation { c in
            host.engine.loop.execute {
                c.resume(returning: host.engine.workers.all.map { $0.connection.pendingOutputBytes }.max() ?? 0)
            }
        }
    }

    /// A worker that sends 100,000 pings and never reads: the host answers while its output to the worker is
    /// small, and no more (a pong queued for each was 5 MB held for a worker that would never take it).
    @Test func aWorkerThatPingsAndNeverReadsGetsNoPongsPiledUp() async throws {
        try await withHost({
            $0.workerEnvironment = ["CRASHER_FAULT_AT_START=pingflood"]
            $0.heartbeatTimeout = .seconds(120)  // it answers no heartbeat either: not killed while it is watched
        }) { host, _ in
            let crasher = try host.extension(identifier: "com.example.crasher")
            let id = crasher.beginRequest(withInputItems: [ExtensionItem(title: "echo")], deadline: 120)
            // Watched until its socket has been full for 3 s (a loaded machine may start it slowly).
            var most = 0
            var fullSince: UInt64?
            let start = monotonicNanoseconds()
            while monotonicNanoseconds() - start < 60_000_000_000 {
                let pending = await mostOutputQueued(host)
                most = max(most, pending)
                if most > 0, fullSince == nil { fullSince = monotonicNanoseconds() }
                if let fullSince, monotonicNanoseconds() - fullSince > 3_000_000_000 { break }
                try await Task.sleep(nanoseconds: 20_000_000)
            }
            #expect(most > 0, "the worker's socket filled: pongs were queued")
            #expect(most <= HostEngine.maxPendingBytesForPong + 4096, "\(most) bytes queued for a worker that never reads")
            crasher.cancelRequest(id)
        }
    }

    /// A worker that provokes answers and never reads them (host calls to a service it may not call, each
    /// refused with an error naming it): once 4,096 wait in the host, the kernel's buffer to it full, it is ended.
    /// The host held every error, 20 MB here, until the heartbeat ended the worker (kept from it here: 120 s);
    /// then up to the output limit (416 MiB at the defaults), the host no longer reading it.
    @Test func aWorkerThatProvokesAnswersAndNeverReadsThemIsEnded() async throws {
        try await withHost({
            $0.workerEnvironment = ["CRASHER_INLINE=1"]
            $0.heartbeatTimeout = .seconds(120)
        }) { host, _ in
            let (crasher, recorder) = try recordedExtension(host, "com.example.crasher")
            let id = crasher.beginRequest(withInputItems: [ExtensionItem(title: "call-unlisted-flood")], deadline: 120)
            // Watched until it ends: what the host held for it at most meanwhile.
            var most = 0
            let start = monotonicNanoseconds()
            while monotonicNanoseconds() - start < 60_000_000_000, recorder.callbacks(id).isEmpty {
                let pending = await mostOutputQueued(host)
                most = max(most, pending)
                try await Task.sleep(nanoseconds: 20_000_000)
            }
            let outcome = await recorder.wait(for: id, timeout: 60)
            guard case .interrupted(.protocolViolation(let detail))? = outcome else {
                Issue.record("ended \(String(describing: outcome)), not as a protocol violation")
                return
            }
            #expect(detail.contains("\(HostEngine.maxAnswersWaiting) answers to its host calls unread"), "\(detail)")
            // 4,096 errors of ~1.1 KB each queued, and the few before the kernel's buffer filled.
            #expect(most <= 8 << 20, "\(most) bytes queued for a worker that never reads")
        }
    }

    /// A hung worker whose own thread sends pongs that answer no ping is still killed as hung: a pong counts only
    /// as the answer to the ping outstanding.
    @Test func aPongThatAnswersNoPingDoesNotKeepAHungWorkerAlive() async throws {
        try await withHost({
            $0.heartbeatInterval = .seconds(0.1)
            $0.heartbeatTimeout = .seconds(0.5)
            $0.workerEnvironment = ["CRASHER_INLINE=1"]
        }) { host, _ in
            let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
            let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "pong-forge")], deadline: 120)
            #expect(await recorder.wait(for: id, timeout: 60) == .interrupted(.hang))
        }
    }

    @Test func pastMaxQueuedRequestsARequestEndsOverloadedAtOnce() async throws {
        try await withSingleSlotHost({ $0.maxQueuedRequests = 10 }) { host, ext in
            let recorder = Recorder()
            recorder.attach(to: ext)
            let blocker = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:1000")])
            #expect(await eventually { ext.pid(for: blocker) != nil })
            let ids = (0..<50).map { _ in ext.beginRequest(withInputItems: [ExtensionItem(title: "echo")]) }
            let outcomes = try #require(await recorder.wait(for: ids))
            let overloaded = ids.filter { outcomes[$0] == .interrupted(.overloaded) }
            #expect(overloaded.count == 40)
            #expect(Array(ids.suffix(40)) == overloaded, "the newest are refused; the queue keeps its order")
            #expect(ids.prefix(10).allSatisfy { outcomes[$0] == .completed([ExtensionItem(title: "echo")]) })
            #expect(await recorder.wait(for: blocker) == .completed([ExtensionItem(title: "slow:1000")]))
        }
    }

    @Test func twoHundredThousandRequestsAtOnceEndQuicklyAndBounded() async throws {
        try await withHost { host, _ in
            let ext = try host.extension(identifier: "com.example.echo")
            let ended = Mutex<(completed: Int, overloaded: Int, other: Int)>((0, 0, 0))
            ext.requestCompletionHandler = { _, _ in ended.withLock { $0.completed += 1 } }
            ext.requestInterruptionHandler = { _, reason in
                ended.withLock { if reason == .overloaded { $0.overloaded += 1 } else { $0.other += 1 } }
            }
            ext.requestCancellationHandler = { _, _ in ended.withLock { $0.other += 1 } }
            let rssBefore = residentBytes() ?? 0
            for _ in 0..<200_000 { _ = ext.beginRequest(withInputItems: [ExtensionItem(title: "x")]) }
            #expect(await eventually(timeout: 120) { ended.withLock { $0.completed + $0.overloaded + $0.other } == 200_000 })
            let counts = ended.withLock { $0 }
            #expect(counts.other == 0)
            #expect(counts.overloaded > 0, "the queue limit was reached")
            let growth = (residentBytes() ?? 0) - rssBefore
            #expect(growth < 256 << 20, "RSS grew \(growth >> 20) MB")
        }
    }
}

final class WeakBox: @unchecked Sendable {
    weak var value: Canary?
    init(_ value: Canary) { self.value = value }
}
