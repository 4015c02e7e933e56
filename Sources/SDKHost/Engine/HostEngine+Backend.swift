// HostEngine's entry points from other threads (HostBackend): each hops to the loop with `execute`, or runs
// there and then on the caller's thread with `executeInline` when the loop is asleep; and its read-only views.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix
import Synchronization

extension HostEngine: HostBackend {
    var extensionIdentifiers: [String] { manifestSnapshot.withLock { $0.keys.sorted() } }
    /// Identifiers of the discovered extensions, sorted.
    package var manifestIdentifiers: [String] { extensionIdentifiers }
    /// The extensions and their extension points, by identifier.
    package var extensions: [ExtensionInfo] {
        manifestSnapshot.withLock { m in
            m.values.map { ExtensionInfo(identifier: $0.identifier, extensionPointIdentifier: $0.extensionPoint) }
        }.sorted { $0.identifier < $1.identifier }
    }
    var mode: HostMode { .embedded }
    func atEndOfTurn(_ body: @escaping @Sendable () -> Void) { loop.atEndOfTurn(body) }
    func workerEvents() -> AsyncStream<WorkerEvent> { events.stream() }
    /// Requests that have begun and not ended (loop thread).
    package var activeRequestCount: Int { requests.count }
    /// How many times each kind of worker transition happened (WorkerLifecycle): the count of kind
    /// `workerTransitionNames[i]` ("starting→ready") at `i` (the simulation adds them up after every schedule, and
    /// names them once at the end).
    package var workerTransitionCounts: [Int] { metrics.transitionCounts }
    package static var workerTransitionNames: [String] { EngineMetrics.transitionNames }
    /// Requests waiting in a queue for a worker (loop thread).
    package var queuedRequestCount: Int { requests.queuedCount }
    /// The longest queue of any pool (loop thread).
    package var longestQueue: Int { requests.longestQueue }
    /// A request that has not ended and is assigned to a worker whose child is one of `pids`, and that child
    /// (loop thread).
    package func requestServed(byAnyOf pids: Set<pid_t>) -> (id: RequestID, pid: pid_t)? {
        requests.first { record in record.worker.map { pids.contains($0.childPID) } ?? false }
            .map { ($0.id, $0.worker!.childPID) }
    }
    /// Whether request `id` has begun and not ended (loop thread).
    package func holds(_ id: RequestID) -> Bool { requests[id] != nil }
    /// Workers listed in any pool (loop thread).
    package var listedWorkerCount: Int { workers.count }

    package func lookupProblem(_ identifier: String) -> HostError? {
        let manifests = manifestSnapshot.withLock { $0 }
        guard let manifest = manifests[identifier] else {
            let known = manifests.keys.sorted().joined(separator: ", ")
            return HostError(.unknownExtension, "unknown extension '\(identifier)' (known: \(known.isEmpty ? "none" : known))")
        }
        if let refusal = manifest.refusal { return refusal }
        guard manifest.executablePath != nil else {
            return HostError(.executableNotFound, "\(identifier): executable '\(manifest.executableName)' not found in "
                + manifest.searchedPaths.joined(separator: ", "))
        }
        return nil
    }

    /// Starts the request from the caller's thread when the loop is asleep and a warm worker has room: the begin
    /// frame is written there and then, and the loop thread is not woken (`EventLoop.executeInline`). Anything
    /// else (a spawn, a queue, an immediate end) is the loop thread's.
    package func submit(_ request: SubmittedRequest) {
        let accepted = loop.executeInline(when: { self.hasWarmRoom(for: request) }) { self.start(request) }
        if !accepted { request.deliver(.interrupted(.hostShutdown)) }
    }

    /// Whether `request` would go straight to a live worker, with nothing to spawn, queue or end (loop's turn).
    func hasWarmRoom(for request: SubmittedRequest) -> Bool {
        guard !shuttingDown, requests[request.id] == nil, let manifest = manifests[request.extensionID] else { return false }
        let key = poolKey(manifest, app: request.app)
        if supervisor.isQuarantined(key, now: loop.now) { return false }
        return workers[key].contains(where: { $0.acceptsRequests && $0.cancelTimers.isEmpty })
    }

    package func cancel(_ id: RequestID) {
        loop.executeInline { self.cancelOnLoop(id) }
    }

    package func credit(_ id: RequestID, _ count: Int) {
        loop.executeInline { self.creditOnLoop(id, count) }
    }

    func pid(for id: RequestID) -> pid_t? { pids.withLock { $0[id] } }

    func status(_ body: @escaping @Sendable (HostStatus?) -> Void) {
        if !loop.execute({ body(self.statusOnLoop()) }) { body(nil) }
    }

    func prewarm(_ extensionID: String, _ done: @escaping @Sendable (Result<pid_t, RequestFailure>) -> Void) {
        if !loop.execute({ self.prewarmOnLoop(extensionID, app: nil, done: done) }) {
            done(.failure(.interrupted(.hostShutdown)))
        }
    }

    package func shutdown(completion: @escaping @Sendable () -> Void) {
        if !loop.execute({ self.shutdownOnLoop(completion: completion) }) { completion() }
    }

    /// Every crash report the engine keeps in memory (up to `crashReportLimit`, uncut), read on the loop and
    /// handed to `body` there; none once it has stopped.
    package func crashReportsInMemory(_ body: @escaping @Sendable ([CrashReport]) -> Void) {
        if !loop.execute({ body(self.metrics.crashReports) }) { body([]) }
    }
}
