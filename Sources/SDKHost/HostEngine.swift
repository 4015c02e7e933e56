// HostEngine: requests, workers and their failures, all on one event-loop thread.
//
// Exactly-once: a request ends only through `finish`, which removes it from `requests` before delivering its
// outcome. Every event (a reply, a worker exit, a deadline, a cancel, shutdown) runs on the loop thread, so
// whichever comes first wins and the others find no record: a late reply is dropped and logged.
// Delivery hops to the caller's queue, so no user code runs on the loop thread or under a lock.

#if canImport(Glibc)
import Glibc
#endif
import SDKPosix
import Synchronization

/// One request from `beginRequest` until its terminal outcome. Loop-confined.
final class RequestRecord {
    let id: RequestID
    let extensionID: String
    var items: [ExtensionItem]
    let deliver: @Sendable (RequestOutcome) -> Void
    let deadline: Double?
    var worker: WorkerProcess?
    var deadlineTimer: TimerID?
    /// Told the worker's pid when the request is sent to one (demo and tools; called on the loop thread).
    var onWorkerAssigned: (@Sendable (pid_t) -> Void)?

    init(id: RequestID, extensionID: String, items: [ExtensionItem], deadline: Double?,
         deliver: @escaping @Sendable (RequestOutcome) -> Void)
    {
        self.id = id
        self.extensionID = extensionID
        self.items = items
        self.deadline = deadline
        self.deliver = deliver
    }
}

/// Counters since the host started.
package struct HostStatistics: Sendable, Equatable {
    package var completions = 0
    package var cancellations = 0
    package var interruptions = 0
    package var crashes = 0
    package var hangs = 0
    package var protocolViolations = 0
    package var spawns = 0
    package init() {}
}

/// A snapshot of one live worker.
package struct WorkerSnapshot: Sendable, Equatable {
    package var extensionIdentifier: String
    package var pid: Int32
    package var uptimeSeconds: Double
    package var inFlight: Int
}

/// What `HostEngine.snapshot` reports.
package struct EngineSnapshot: Sendable {
    package var totals: HostStatistics
    package var perExtension: [String: HostStatistics]
    package var crashReports: [CrashReport]
    package var workers: [WorkerSnapshot]
}

/// The engine. `@unchecked Sendable`: all mutable state is confined to `loop`'s thread (entry points hop there
/// with `loop.execute`), except `pids`, which sits behind a Mutex for `pid(for:)`.
package final class HostEngine: @unchecked Sendable {
    package let loop: EventLoop
    let configuration: HostConfiguration
    let manifests: [String: ExtensionManifest]
    let crashStore: CrashReportStore?
    let pids = Mutex<[RequestID: pid_t]>([:])
    private let hostPid = getpid()

    // Loop-confined state.
    var workers: [String: [WorkerProcess]] = [:]
    var requests: [RequestID: RequestRecord] = [:]
    var waiting: [String: [RequestRecord]] = [:]
    var crashReports: [CrashReport] = []
    var statistics = HostStatistics()
    var perExtension: [String: HostStatistics] = [:]
    var readBuffer = [UInt8](repeating: 0, count: 64 * 1024)
    var heartbeatTimer: TimerID?
    var shuttingDown = false
    var shutdownCompletions: [@Sendable () -> Void] = []
    /// The engine itself, from the start of shutdown until its loop has stopped. Worker callbacks capture the
    /// engine unowned; an app may drop its host without awaiting shutdown, and the engine must outlive the
    /// reaping of its workers.
    private var keepAliveUntilStopped: HostEngine?

    package init(configuration: HostConfiguration) throws(HostError) {
        self.configuration = configuration
        manifests = try ExtensionManifest.discover(in: configuration)
        crashStore = try configuration.crashReportDirectory.map { directory throws(HostError) in
            try CrashReportStore(directory: directory, limit: configuration.crashReportLimit)
        }
        do {
            loop = try EventLoop(name: "sdk-host")
        } catch {
            throw HostError(.system, "cannot start the host event loop: \(error)")
        }
    }

    /// Counts one event for `extensionID` and in the totals.
    func count(_ extensionID: String, _ counter: WritableKeyPath<HostStatistics, Int>) {
        statistics[keyPath: counter] += 1
        perExtension[extensionID, default: HostStatistics()][keyPath: counter] += 1
    }

    package func log(_ level: LogLevel, _ message: @autoclosure () -> String) {
        guard level >= configuration.logLevel else { return }
        if let handler = configuration.logHandler {
            handler(level, message())
        } else {
            var line = "sdk-host: \(level): \(message())\n"
            line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
        }
    }

    // MARK: Requests (loop thread)

    /// Starts `request` (loop thread). The daemon calls this directly; `submit` hops here from any thread.
    package func start(_ request: SubmittedRequest) {
        let record = RequestRecord(
            id: request.id, extensionID: request.extensionID, items: request.items,
            deadline: request.deadline ?? manifests[request.extensionID]?.policy.requestDeadline,
            deliver: request.deliver)
        record.onWorkerAssigned = request.onWorkerAssigned
        start(record)
    }

    func start(_ record: RequestRecord) {
        loop.preconditionInLoop()
        if shuttingDown {
            record.deliver(.interrupted(.hostShutdown))
            return
        }
        requests[record.id] = record
        if let deadline = record.deadline {
            let id = record.id
            record.deadlineTimer = loop.schedule(afterNanoseconds: nanoseconds(deadline)) { [unowned self] in
                self.deadlinePassed(id)
            }
        }
        dispatch(record)
    }

    /// Sends `record` to a worker with room, spawning one if allowed, or queues it.
    func dispatch(_ record: RequestRecord) {
        guard let manifest = manifests[record.extensionID] else {
            finish(record.id, .interrupted(.launchFailed("unknown extension \(record.extensionID)")))
            return
        }
        let pool = workers[record.extensionID] ?? []
        if let worker = pool.first(where: { $0.acceptsRequests }) {
            send(record, to: worker)
        } else if pool.filter({ $0.state != .retiring }).count < manifest.policy.maxWorkers {
            do {
                let worker = try spawnWorker(manifest)
                send(record, to: worker)
            } catch {
                log(.error, "\(record.extensionID): cannot launch worker: \(error)")
                finish(record.id, .interrupted(.launchFailed(error.description)))
            }
        } else {
            waiting[record.extensionID, default: []].append(record)
        }
    }

    func send(_ record: RequestRecord, to worker: WorkerProcess) {
        record.worker = worker
        worker.inFlight.insert(record.id)
        if let timer = worker.idleTimer {
            loop.cancelTimer(timer)
            worker.idleTimer = nil
        }
        pids.withLock { $0[record.id] = worker.pid }
        record.onWorkerAssigned?(worker.pid)
        let items = record.items
        record.items = []  // the worker has them now; the host keeps no copy
        send(.begin(id: record.id, items: items), to: worker)
    }

    /// Ends a request: removes it, then delivers. Returns false if it had already ended.
    @discardableResult
    func finish(_ id: RequestID, _ outcome: RequestOutcome) -> Bool {
        guard let record = requests.removeValue(forKey: id) else { return false }
        if let timer = record.deadlineTimer { loop.cancelTimer(timer) }
        pids.withLock { _ = $0.removeValue(forKey: id) }
        record.worker = nil
        record.onWorkerAssigned = nil
        switch outcome {
        case .completed: count(record.extensionID, \.completions)
        case .cancelled: count(record.extensionID, \.cancellations)
        case .interrupted: count(record.extensionID, \.interruptions)
        }
        record.deliver(outcome)
        return true
    }

    /// Cancels `id` (loop thread).
    package func cancelOnLoop(_ id: RequestID) {
        loop.preconditionInLoop()
        guard let record = requests[id] else {
            log(.debug, "cancel for \(id), which has already ended; ignored")
            return
        }
        let worker = record.worker
        finish(id, .cancelled(.cancelledByHost))
        guard let worker, worker.inFlight.contains(id), worker.state != .dead else { return }
        send(.cancel(id: id), to: worker)
        // The worker keeps the slot until it acknowledges; one that ignores the cancel is killed.
        loop.schedule(afterNanoseconds: nanoseconds(configuration.cancelGracePeriod)) { [unowned self] in
            if worker.inFlight.contains(id), worker.state != .dead {
                self.log(.warning, "\(worker.extensionID) pid \(worker.pid) ignored cancel of \(id); killing it")
                self.kill(worker, .hang)
            }
        }
    }

    func deadlinePassed(_ id: RequestID) {
        guard let record = requests[id] else { return }
        record.deadlineTimer = nil
        let worker = record.worker
        log(.warning, "\(record.extensionID): request \(id) passed its deadline of \(record.deadline ?? 0) s")
        finish(id, .interrupted(.hang))
        if let worker, worker.state != .dead { kill(worker, .hang) }
    }

    /// Hands queued requests to workers that have room.
    func drainWaiting(_ extensionID: String) {
        guard var queue = waiting[extensionID], !queue.isEmpty else { return }
        waiting[extensionID] = nil
        while !queue.isEmpty {
            let record = queue.removeFirst()
            guard requests[record.id] != nil else { continue }  // cancelled or timed out while waiting
            dispatch(record)
            if let parked = waiting[extensionID], parked.last === record {
                // No room yet: keep the rest in order behind it.
                waiting[extensionID] = parked + queue
                return
            }
        }
    }

    // MARK: Shutdown

    package func shutdownOnLoop(completion: (@Sendable () -> Void)?) {
        loop.preconditionInLoop()
        if let completion { shutdownCompletions.append(completion) }
        if shuttingDown { return }
        shuttingDown = true
        keepAliveUntilStopped = self
        for id in Array(requests.keys) { finish(id, .interrupted(.hostShutdown)) }
        waiting.removeAll()
        for worker in workers.values.joined() {
            worker.state = .retiring
            unregisterSocket(worker)
            worker.kill(reason: .hostShutdown)
        }
        stopIfIdle()
    }

    /// Once shutting down and every worker is reaped, stops the loop.
    func stopIfIdle() {
        guard shuttingDown, workers.values.allSatisfy(\.isEmpty) else { return }
        if let timer = heartbeatTimer { loop.cancelTimer(timer) }
        let completions = shutdownCompletions
        shutdownCompletions = []
        // The loop runs this after its last task, when no handler or timer can reach the engine any more.
        loop.stop { [self] in
            keepAliveUntilStopped = nil
            for completion in completions { completion() }
        }
    }
}

extension HostEngine: HostBackend {
    var extensionIdentifiers: [String] { manifests.keys.sorted() }
    /// Identifiers of the discovered extensions, sorted.
    package var manifestIdentifiers: [String] { manifests.keys.sorted() }
    /// Requests that have begun and not ended (loop thread).
    package var activeRequestCount: Int { requests.count }

    func lookupProblem(_ identifier: String) -> HostError? {
        guard let manifest = manifests[identifier] else {
            let known = manifests.keys.sorted().joined(separator: ", ")
            return HostError(.unknownExtension, "unknown extension '\(identifier)' (known: \(known.isEmpty ? "none" : known))")
        }
        guard manifest.executablePath != nil else {
            return HostError(.executableNotFound, "\(identifier): executable '\(manifest.executableName)' not found in "
                + manifest.searchedPaths.joined(separator: ", "))
        }
        return nil
    }

    func submit(_ request: SubmittedRequest) {
        if !loop.execute({ self.start(request) }) { request.deliver(.interrupted(.hostShutdown)) }
    }

    func cancel(_ id: RequestID) {
        loop.execute { self.cancelOnLoop(id) }
    }

    func pid(for id: RequestID) -> pid_t? { pids.withLock { $0[id] } }

    package func shutdown(completion: @escaping @Sendable () -> Void) {
        if !loop.execute({ self.shutdownOnLoop(completion: completion) }) { completion() }
    }

    /// Counters, crash reports and live workers, read on the loop and handed to `body` there.
    package func snapshot(_ body: @escaping @Sendable (EngineSnapshot) -> Void) {
        let accepted = loop.execute {
            let now = monotonicNanoseconds()
            let workers = self.workers.values.joined().map {
                WorkerSnapshot(extensionIdentifier: $0.extensionID, pid: $0.pid,
                               uptimeSeconds: Double(now - $0.startedAt) / 1e9, inFlight: $0.inFlight.count)
            }
            body(EngineSnapshot(totals: self.statistics, perExtension: self.perExtension,
                                crashReports: self.crashReports, workers: workers))
        }
        if !accepted { body(EngineSnapshot(totals: HostStatistics(), perExtension: [:], crashReports: [], workers: [])) }
    }
}

func nanoseconds(_ seconds: Double) -> UInt64 { UInt64(max(0, seconds) * 1e9) }
