// Host and Extension: the public API (shared/DESIGN.md "Host API"). Every call returns at once: work is queued
// to the engine's event loop, and outcomes come back on the caller's queue.

#if canImport(Glibc)
import SDKWire
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
    /// - Throws: `HostError` for a value of `configuration` that its key in the daemon's config file (or in a
    ///   manifest, for `defaultPolicy`) would refuse, naming both; an invalid manifest (naming the file and key),
    ///   an unreadable search path, or a failure to start the event loop.
    public init(configuration: HostConfiguration) throws(HostError) {
        try configuration.validate()
        backend = try HostEngine(configuration: configuration)
    }

    init(backend: any HostBackend) { self.backend = backend }

    /// This library's version, as `sdk-host --version` prints it.
    public static let version = "0.2.0"

    deinit {
        backend.shutdown {}
    }

    /// Identifiers of every extension this host serves, sorted.
    public var extensionIdentifiers: [String] { backend.extensionIdentifiers }

    /// Every extension this host serves with its extension point, sorted by identifier. Through a daemon, the
    /// daemon's list (updated when it rescans its manifests).
    public var extensions: [ExtensionInfo] { backend.extensions }

    /// The extensions of one extension point (`NSExtensionPointIdentifier`), sorted by identifier.
    public func extensions(forExtensionPoint point: String) -> [ExtensionInfo] {
        backend.extensions.filter { $0.extensionPointIdentifier == point }
    }

    /// Whether this host is embedded or a daemon's client (and which daemon).
    public var mode: HostMode { backend.mode }

    /// Worker lifecycle events from now on: spawned, ready, exited (with the reason), recycled, quarantined.
    /// Each call returns a new sequence; it ends when the host shuts down, and keeps at most the newest 1024
    /// events a slow reader has not taken. Through a daemon, the daemon's events for every app.
    public func workerEvents() -> AsyncStream<WorkerEvent> { backend.workerEvents() }

    /// The newest crash reports (at most 8; stderr tails cut to 2 KiB), oldest first. All of them are files in the
    /// crash report folder: `CrashReportStore.load(directory:)`.
    public func crashReports() async -> [CrashReport] { await status()?.recentCrashes ?? [] }

    /// The newest leak reports (at most 32), oldest first.
    public func leakReports() async -> [LeakReport] { await status()?.recentLeaks ?? [] }

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

    /// The host's status: per extension its requests and their outcomes, latency, slow requests, crash-loop state and
    /// workers; the same figures as `sdk-host status --json`. Through the daemon, the daemon's status (nil if it
    /// cannot be reached, or does not answer within the client's `reconnectTimeout`). Cancelling the calling Task
    /// returns nil at once.
    public func status() async -> HostStatus? {
        if Task.isCancelled { return nil }
        let answer = AnswerOnce<HostStatus?>()
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                answer.wait(continuation)
                backend.status { answer.give($0) }
            }
        } onCancel: {
            answer.give(nil)
        }
    }

    /// Every crash report an embedded host keeps in memory (up to `crashReportLimit`, with their whole stderr
    /// tails); `status()` carries the newest 8, cut to 2 KiB each.
    package func crashReportsInMemory() async -> [CrashReport] {
        await withCheckedContinuation { continuation in
            engine.crashReportsInMemory { continuation.resume(returning: $0) }
        }
    }
}

/// The handlers an `Extension` calls; read at delivery time, so they may be set after a request begins.
final class HandlerBox: Sendable {
    struct Handlers {
        var completion: (@Sendable (RequestID, [ExtensionItem]) -> Void)?
        var cancellation: (@Sendable (RequestID, ExtensionError) -> Void)?
        var interruption: (@Sendable (RequestID, InterruptionReason) -> Void)?
        var progress: (@Sendable (RequestID, [ExtensionItem]) -> Void)?
        /// The queue the app chose.
        var queue: DispatchQueue
        /// A serial queue that runs on `queue`: one request's partial results and outcome stay in order even on a
        /// concurrent queue.
        var serial: DispatchQueue
        /// Hands calls to `serial` in batches.
        var batcher: CallbackBatcher
        var onHostLoop = false
        /// `outcomes()` streams.
        var streams: [AsyncStream<EndedRequest>.Continuation] = []
    }

    let state: SpinningMutex<Handlers>

    init(queue: DispatchQueue) {
        state = SpinningMutex(Handlers(queue: queue, serial: queue, batcher: CallbackBatcher(queue: queue)))
    }

    /// Calls the progress handler, if any, with no lock held.
    func invokeProgress(_ id: RequestID, _ items: [ExtensionItem]) {
        let handler = state.withLock { $0.progress }
        handler?(id, items)
    }

    /// Calls the handler for `outcome` with no lock held.
    func invoke(_ id: RequestID, _ outcome: RequestOutcome) {
        let handlers = state.withLock { $0 }
        switch outcome {
        case .completed(let items): handlers.completion?(id, items)
        case .cancelled(let error): handlers.cancellation?(id, error)
        case .interrupted(let reason): handlers.interruption?(id, reason)
        }
        for stream in handlers.streams { stream.yield(EndedRequest(id: id, outcome: outcome)) }
    }

    func finishStreams() {
        let streams = state.withLock { h in
            defer { h.streams = [] }
            return h.streams
        }
        for stream in streams { stream.finish() }
    }
}

/// One extension, as the app uses it: begin and cancel requests, and receive exactly one terminal callback per
/// request on `callbackQueue`.
public final class Extension: Sendable {
    /// The extension's identifier.
    public let identifier: String
    let host: ExtensionHost
    private let handlers: HandlerBox
    /// The services its requests may call (HostServices.swift).
    let services = HostServiceTable()

    init(identifier: String, host: ExtensionHost) {
        self.identifier = identifier
        self.host = host
        handlers = HandlerBox(queue: DispatchQueue(label: "sdk-host.callbacks.\(identifier)"))
    }

    deinit {
        handlers.finishStreams()
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

    /// Called with each partial result the extension sends for a request begun with `beginRequest`
    /// (`context.send` in the extension), in order, before the request's terminal handler. The extension may run
    /// at most 16 partial results ahead of this handler: it waits while they are not handled. With no handler set,
    /// partial results are dropped.
    public var requestProgressHandler: (@Sendable (RequestID, [ExtensionItem]) -> Void)? {
        get { handlers.state.withLock { $0.progress } }
        set { handlers.state.withLock { $0.progress = newValue } }
    }

    /// The queue the handlers run on. Defaults to a serial queue owned by this `Extension`. On a concurrent
    /// queue, handlers still run one at a time, in order.
    public var callbackQueue: DispatchQueue {
        get { handlers.state.withLock { $0.queue } }
        set {
            let serial = DispatchQueue(label: "sdk-host.callbacks.\(identifier)", target: newValue)
            let batcher = CallbackBatcher(queue: serial)
            handlers.state.withLock {
                $0.queue = newValue
                $0.serial = serial
                $0.batcher = batcher
            }
        }
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
    ///   - deadline: How long the request may run: past it, it ends interrupted with `.timedOut` and its worker
    ///     is told to cancel it (killed only if it ignores that for `cancelGracePeriod`); nil for the manifest's
    ///     `RequestDeadlineSeconds`, which is also a limit: a later deadline is cut to it.
    /// - Returns: The request's identifier.
    @discardableResult
    public func beginRequest(withInputItems items: [ExtensionItem], deadline: Duration? = nil) -> RequestID {
        beginRequest(withInputItems: items, deadline: deadline.map(seconds), onWorkerAssigned: nil)
    }

    /// `beginRequest` with the deadline in seconds (the package's own tools and tests).
    @discardableResult
    package func beginRequest(withInputItems items: [ExtensionItem], deadline: Double?) -> RequestID {
        beginRequest(withInputItems: items, deadline: deadline, onWorkerAssigned: nil)
    }

    /// `beginRequest`, also telling `onWorkerAssigned` (on the host's loop thread; keep it trivial) the pid of
    /// the worker the request is sent to, which may not have finished its handshake (see `pid(for:)`). For tools
    /// that report pids after the request has ended.
    @discardableResult
    package func beginRequest(
        withInputItems items: [ExtensionItem], deadline: Double?, onWorkerAssigned: (@Sendable (pid_t) -> Void)?
    ) -> RequestID {
        let id = RequestID()
        let box = handlers
        let (batcher, onHostLoop) = handlers.state.withLock { ($0.batcher, $0.onHostLoop) }
        let backend = host.backend
        // The backend calls `deliver` and `progress` on its loop thread with no lock held. A partial result is
        // credited back once its handler has returned: that is what paces the worker. Off the loop, handler calls
        // go to the callback queue in few hops (`CallbackBatcher`).
        let deliver: @Sendable (RequestOutcome) -> Void
        let progress: @Sendable ([ExtensionItem]) -> Void
        if onHostLoop {
            deliver = { outcome in box.invoke(id, outcome) }
            progress = { items in
                box.invokeProgress(id, items)
                backend.credit(id, 1)
            }
        } else {
            deliver = { outcome in batcher.add({ box.invoke(id, outcome) }, from: backend) }
            progress = { items in
                batcher.add({
                    box.invokeProgress(id, items)
                    backend.credit(id, 1)
                }, from: backend)
            }
        }
        submit(id: id, items: items, deadline: deadline, onWorkerAssigned: onWorkerAssigned, deliver: deliver,
               progress: progress)
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
    ///
    /// A request can be sent to a worker that has not finished its handshake. Should that worker die before
    /// it, no handler ran: the request goes to the next worker (at most twice) instead of being interrupted,
    /// and this pid changes.
    public func pid(for id: RequestID) -> pid_t? {
        host.backend.pid(for: id)
    }

    /// Runs one request and returns the items it completed with. Its outcome goes only to this call, not to the
    /// handlers. For the request's id and worker pid while it runs, use `start(_:deadline:)`.
    ///
    /// - Parameters:
    ///   - items: The input items.
    ///   - deadline: As for `beginRequest`.
    /// - Returns: The completed items.
    /// - Throws: `CancellationError` when the calling Task is cancelled (the request is cancelled at the
    ///   worker); `RequestFailure.cancelled` when the extension cancels; `RequestFailure.interrupted` when the
    ///   request is interrupted.
    public func perform(_ items: [ExtensionItem], deadline: Duration? = nil) async throws -> [ExtensionItem] {
        try await start(items, deadline: deadline).value
    }

    /// `perform` with the deadline in seconds (the package's own tools and tests).
    package func perform(_ items: [ExtensionItem], deadline: Double?) async throws -> [ExtensionItem] {
        try await start(items, deadline: deadline).value
    }

    /// Sends `request` as one item (`ExtensionItem(encoding:)`) and decodes the first returned item as `Response`.
    ///
    /// - Throws: As `perform(_:deadline:)`; `EncodingError` or `DecodingError` when a value does not fit
    ///   (`RequestFailure.emptyResponse`... see `ExtensionItem.decode`).
    public func perform<Request: Encodable, Response: Decodable>(
        _ request: Request, returning: Response.Type, deadline: Duration? = nil
    ) async throws -> Response {
        let items = try await perform([ExtensionItem(encoding: request)], deadline: deadline)
        guard let first = items.first else {
            throw DecodingError.valueNotFound(Response.self, .init(codingPath: [], debugDescription: "the extension returned no items"))
        }
        return try first.decode(Response.self)
    }

    /// Starts a request and returns a handle to it at once: its id, the pid of the worker running it, `cancel()`,
    /// and its result (`value`, `outcome`). Like `perform`, its outcome goes only to the handle.
    public func start(_ items: [ExtensionItem], deadline: Duration? = nil) -> RequestTask {
        start(items, deadline: deadline.map(seconds))
    }

    package func start(_ items: [ExtensionItem], deadline: Double?) -> RequestTask {
        let task = RequestTask(id: RequestID(), backend: host.backend)
        submit(id: task.id, items: items, deadline: deadline, onWorkerAssigned: { [task] pid in task.assigned(pid) }) {
            [task] outcome in task.ended(outcome)
        }
        return task
    }

    /// Every request's end, for `for await` loops (in `@MainActor` code, say) instead of handlers: each request
    /// begun with `beginRequest` ends here as well as in its handler. The stream keeps the newest 4096 ends a slow
    /// reader has not taken; it finishes when this `Extension` is released.
    public func outcomes() -> AsyncStream<EndedRequest> {
        let (stream, continuation) = AsyncStream<EndedRequest>.makeStream(bufferingPolicy: .bufferingNewest(4096))
        handlers.state.withLock { $0.streams.append(continuation) }
        return stream
    }

    /// Sets the three handlers to run on the main actor, so that they can update `@MainActor` state directly.
    /// Each runs in its own main-actor task, so the main actor must be serviced (an app's run loop, or an
    /// `async` main).
    public func setMainActorHandlers(
        completion: @escaping @MainActor @Sendable (RequestID, [ExtensionItem]) -> Void,
        cancellation: @escaping @MainActor @Sendable (RequestID, ExtensionError) -> Void,
        interruption: @escaping @MainActor @Sendable (RequestID, InterruptionReason) -> Void
    ) {
        callsHandlersOnHostLoop = true  // the hop to the main actor is the only hand-off needed
        requestCompletionHandler = { id, items in Task { @MainActor in completion(id, items) } }
        requestCancellationHandler = { id, error in Task { @MainActor in cancellation(id, error) } }
        requestInterruptionHandler = { id, reason in Task { @MainActor in interruption(id, reason) } }
    }

    func submit(id: RequestID, items: [ExtensionItem], deadline: Double?,
                onWorkerAssigned: (@Sendable (pid_t) -> Void)?,
                deliver: @escaping @Sendable (RequestOutcome) -> Void,
                progress: (@Sendable ([ExtensionItem]) -> Void)? = nil)
    {
        var request = SubmittedRequest(
            id: id, extensionID: identifier, items: items, deadline: deadline, onWorkerAssigned: onWorkerAssigned,
            deliver: deliver, progress: progress)
        request.services = services
        host.backend.submit(request)
    }
}

/// One answer to one waiter, whichever comes first: the backend's, or the cancelled Task's (nil). Later ones are
/// dropped; one that comes before the waiter is kept for it.
final class AnswerOnce<Value: Sendable>: Sendable {
    private enum Slot {
        case waiting(CheckedContinuation<Value, Never>?)
        case given(Value)
    }
    private let slot = Mutex(Slot.waiting(nil))

    func wait(_ continuation: CheckedContinuation<Value, Never>) {
        let ready = slot.withLock { s -> Slot in
            if case .waiting = s { s = .waiting(continuation) }
            return s
        }
        if case .given(let value) = ready { continuation.resume(returning: value) }
    }

    func give(_ value: Value) {
        let waiter = slot.withLock { s -> CheckedContinuation<Value, Never>? in
            guard case .waiting(let continuation) = s else { return nil }
            s = .given(value)
            return continuation
        }
        waiter?.resume(returning: value)
    }
}
