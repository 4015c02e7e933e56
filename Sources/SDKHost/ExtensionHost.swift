// Host and Extension: the public API (shared/DESIGN.md "Host API"). Every call returns at once: work is queued
// to the engine's event loop, and outcomes come back on the caller's queue.

#if canImport(Glibc)
import Glibc
#endif
import Dispatch
import SDKPosix
import Synchronization

/// An extension host. Create one embedded (it spawns and supervises the workers itself), look extensions up by
/// identifier, and send them requests.
public final class ExtensionHost: Sendable {
    let backend: any HostBackend

    /// The embedded engine, when this host is embedded.
    package var engine: HostEngine { backend as! HostEngine }

    /// Creates an embedded host: discovers extension manifests and starts the host's event loop.
    ///
    /// - Parameter configuration: Where extensions and their executables are, and the host's policies.
    /// - Throws: `HostError` for an invalid manifest (naming the file and key), an unreadable search path, or a
    ///   failure to start the event loop.
    public init(configuration: HostConfiguration) throws(HostError) {
        backend = try HostEngine(configuration: configuration)
    }

    init(backend: any HostBackend) { self.backend = backend }

    deinit {
        backend.shutdown {}
    }

    /// Identifiers of every extension this host serves, sorted.
    public var extensionIdentifiers: [String] { backend.extensionIdentifiers }

    /// Looks up an extension.
    ///
    /// - Parameter identifier: The manifest's `CFBundleIdentifier`, e.g. "com.example.echo".
    /// - Returns: A new `Extension` with no handlers set.
    /// - Throws: `HostError.Code.unknownExtension` if no manifest has that identifier, or
    ///   `.executableNotFound` if its executable is not in any executable search path.
    public func `extension`(identifier: String) throws(HostError) -> Extension {
        if let problem = backend.lookupProblem(identifier) { throw problem }
        return Extension(identifier: identifier, host: self)
    }

    /// Stops the host: in-flight requests are interrupted (`hostShutdown`), workers are killed and reaped, and
    /// the event loop ends. Returns when all of that is done. Later requests are interrupted at once.
    public func shutdown() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            shutdown { continuation.resume() }
        }
    }

    /// Stops the host, calling `completion` (on an internal thread) when done. See `shutdown()`.
    public func shutdown(completion: @escaping @Sendable () -> Void) {
        backend.shutdown(completion: completion)
    }

    /// The host's status: per extension its requests and their outcomes, latency, hangs, crash-loop state and
    /// workers; the same figures as `sdk-host status --json`. Through the daemon, the daemon's status (nil if it
    /// cannot be reached).
    public func status() async -> HostStatus? {
        await withCheckedContinuation { continuation in backend.status { continuation.resume(returning: $0) } }
    }

    /// Counters, crash reports kept in memory and live workers of an embedded host, read on its loop.
    package func inspect(_ body: @escaping @Sendable (HostStatistics, [CrashReport], [WorkerSnapshot]) -> Void) {
        engine.snapshot { snapshot in body(snapshot.totals, snapshot.crashReports, snapshot.workers) }
    }

    /// Async form of `inspect`.
    package func inspect() async -> (HostStatistics, [CrashReport], [WorkerSnapshot]) {
        await withCheckedContinuation { continuation in
            inspect { stats, crashes, workers in continuation.resume(returning: (stats, crashes, workers)) }
        }
    }
}

/// The handlers an `Extension` calls; read at delivery time, so they may be set after a request begins.
final class HandlerBox: Sendable {
    struct Handlers {
        var completion: (@Sendable (RequestID, [ExtensionItem]) -> Void)?
        var cancellation: (@Sendable (RequestID, ExtensionError) -> Void)?
        var interruption: (@Sendable (RequestID, InterruptionReason) -> Void)?
        var queue: DispatchQueue
        var onHostLoop = false
    }

    let state: Mutex<Handlers>

    init(queue: DispatchQueue) { state = Mutex(Handlers(queue: queue)) }

    /// Calls the handler for `outcome` with no lock held.
    func invoke(_ id: RequestID, _ outcome: RequestOutcome) {
        let handlers = state.withLock { $0 }
        switch outcome {
        case .completed(let items): handlers.completion?(id, items)
        case .cancelled(let error): handlers.cancellation?(id, error)
        case .interrupted(let reason): handlers.interruption?(id, reason)
        }
    }
}

/// One extension, as the app uses it: begin and cancel requests, and receive exactly one terminal callback per
/// request on `callbackQueue`.
public final class Extension: Sendable {
    /// The extension's identifier.
    public let identifier: String
    let host: ExtensionHost
    private let handlers: HandlerBox

    init(identifier: String, host: ExtensionHost) {
        self.identifier = identifier
        self.host = host
        handlers = HandlerBox(queue: DispatchQueue(label: "sdk-host.callbacks.\(identifier)"))
    }

    /// Called when the worker completed a request, with the items it returned.
    public var requestCompletionHandler: (@Sendable (RequestID, [ExtensionItem]) -> Void)? {
        get { handlers.state.withLock { $0.completion } }
        set { handlers.state.withLock { $0.completion = newValue } }
    }

    /// Called when a request was cancelled: by the host (`ExtensionError.cancelledByHost`) or by the extension
    /// (its own error).
    public var requestCancellationHandler: (@Sendable (RequestID, ExtensionError) -> Void)? {
        get { handlers.state.withLock { $0.cancellation } }
        set { handlers.state.withLock { $0.cancellation = newValue } }
    }

    /// Called when a request was interrupted: the worker crashed, hung, broke the protocol, or could not start,
    /// or the host shut down.
    public var requestInterruptionHandler: (@Sendable (RequestID, InterruptionReason) -> Void)? {
        get { handlers.state.withLock { $0.interruption } }
        set { handlers.state.withLock { $0.interruption = newValue } }
    }

    /// The queue the handlers run on. Defaults to a serial queue owned by this `Extension`.
    public var callbackQueue: DispatchQueue {
        get { handlers.state.withLock { $0.queue } }
        set { handlers.state.withLock { $0.queue = newValue } }
    }

    /// When true, handlers run directly on the host's event-loop thread (with no lock held) instead of on
    /// `callbackQueue`, saving a thread hand-off per request. They must then be quick and never block: every
    /// other request of the host waits while one runs, and waiting there for another request deadlocks.
    /// Applies to requests begun after it is set. Default false.
    public var callsHandlersOnHostLoop: Bool {
        get { handlers.state.withLock { $0.onHostLoop } }
        set { handlers.state.withLock { $0.onHostLoop = newValue } }
    }

    /// Starts a request. Never blocks: the request is queued to the host's event loop, a worker is launched if
    /// none has room, and exactly one of the three handlers is called later with the returned id.
    ///
    /// - Parameters:
    ///   - items: The input items.
    ///   - deadline: Seconds before the request counts as hung (its worker is killed and the request
    ///     interrupted with `.hang`); nil for the manifest's `RequestDeadlineSeconds`.
    /// - Returns: The request's identifier.
    @discardableResult
    public func beginRequest(withInputItems items: [ExtensionItem], deadline: Double? = nil) -> RequestID {
        beginRequest(withInputItems: items, deadline: deadline, onWorkerAssigned: nil)
    }

    /// `beginRequest`, also telling `onWorkerAssigned` (on the host's loop thread; keep it trivial) the pid of
    /// the worker the request is sent to. For tools that report pids after the request has ended.
    @discardableResult
    package func beginRequest(
        withInputItems items: [ExtensionItem], deadline: Double?, onWorkerAssigned: (@Sendable (pid_t) -> Void)?
    ) -> RequestID {
        let id = RequestID()
        let box = handlers
        let (queue, onHostLoop) = handlers.state.withLock { ($0.queue, $0.onHostLoop) }
        // The backend calls `deliver` on its loop thread with no lock held.
        let deliver: @Sendable (RequestOutcome) -> Void
        if onHostLoop {
            deliver = { outcome in box.invoke(id, outcome) }
        } else {
            deliver = { outcome in queue.async { box.invoke(id, outcome) } }
        }
        submit(id: id, items: items, deadline: deadline, onWorkerAssigned: onWorkerAssigned, deliver: deliver)
        return id
    }

    /// Cancels a request. The cancellation handler runs (with `ExtensionError.cancelledByHost`) unless the
    /// request has already ended; the worker is told, and killed if it ignores the cancel past the grace period.
    public func cancelRequest(_ id: RequestID) {
        host.backend.cancel(id)
    }

    /// Starts a worker for this extension now, if none is ready, and returns its pid once it has handshaken, so
    /// that a first request does not wait for the spawn. Through the daemon, the worker is this app's own.
    /// It is retired when idle like any other (`IdleTimeoutSeconds`); `MinWarmWorkers` keeps workers for good.
    ///
    /// - Throws: `RequestFailure.interrupted` if no worker could be started (`launchFailed`, `quarantined`,
    ///   `hostShutdown`, or the worker died before its handshake).
    @discardableResult
    public func prewarm() async throws(RequestFailure) -> pid_t {
        let backend = host.backend
        let id = identifier
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<pid_t, RequestFailure>, Never>) in
            backend.prewarm(id) { continuation.resume(returning: $0) }
        }
        return try result.get()
    }

    /// The pid of the worker running the request, or nil if it has not been sent to a worker or has ended.
    public func pid(for id: RequestID) -> pid_t? {
        host.backend.pid(for: id)
    }

    /// Runs one request and returns the items it completed with. Its outcome goes only to this call, not to the
    /// handlers.
    ///
    /// - Parameters:
    ///   - items: The input items.
    ///   - deadline: As for `beginRequest`.
    /// - Returns: The completed items.
    /// - Throws: `CancellationError` when the calling Task is cancelled (the request is cancelled at the
    ///   worker); `RequestFailure.cancelled` when the extension cancels; `RequestFailure.interrupted` when the
    ///   request is interrupted.
    public func perform(_ items: [ExtensionItem], deadline: Double? = nil) async throws -> [ExtensionItem] {
        let id = RequestID()
        let gate = Mutex<PerformGate>(.notStarted)
        let backend = host.backend
        return try await withTaskCancellationHandler {
            let outcome = await withCheckedContinuation { (continuation: CheckedContinuation<RequestOutcome, Never>) in
                submit(id: id, items: items, deadline: deadline, onWorkerAssigned: nil) { outcome in
                    continuation.resume(returning: outcome)
                }
                let cancelNow = gate.withLock { g -> Bool in
                    defer { g = .started }
                    return g == .cancelledBeforeStart
                }
                if cancelNow { backend.cancel(id) }
            }
            switch outcome {
            case .completed(let result):
                return result
            case .cancelled(let error):
                if error == .cancelledByHost, Task.isCancelled { throw CancellationError() }
                throw RequestFailure.cancelled(error)
            case .interrupted(let reason):
                throw RequestFailure.interrupted(reason)
            }
        } onCancel: {
            let started = gate.withLock { g -> Bool in
                if g == .started { return true }
                g = .cancelledBeforeStart
                return false
            }
            if started { backend.cancel(id) }
        }
    }

    private enum PerformGate { case notStarted, cancelledBeforeStart, started }

    private func submit(id: RequestID, items: [ExtensionItem], deadline: Double?,
                        onWorkerAssigned: (@Sendable (pid_t) -> Void)?,
                        deliver: @escaping @Sendable (RequestOutcome) -> Void)
    {
        host.backend.submit(SubmittedRequest(
            id: id, extensionID: identifier, items: items, deadline: deadline, onWorkerAssigned: onWorkerAssigned,
            deliver: deliver))
    }
}
