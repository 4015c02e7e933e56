// Partial results on the app's side: `Extension.stream` (an AsyncThrowingStream of item batches that ends with
// the request's outcome) and `perform(_:deadline:isolation:progress:)`, which reads that stream in the caller's
// isolation.
//
// Backpressure: a partial result is credited back to the worker only when the app takes it (the stream hands it
// out, as `perform` takes it before calling its progress closure), so at most `streamWindow` wait here per request and a fast worker
// waits in `context.send`. Order: partial results and the outcome enter one feed in the order the host's loop
// saw them, so none is ever handed out after the outcome.
import SDKWire
import Synchronization

/// One streamed request's partial results and outcome, between the host's loop (producer) and the stream's
/// consumer. Released when the stream is: then the request, if still running, is cancelled.
final class StreamFeed: Sendable {
    let id: RequestID
    let backend: any HostBackend

    private struct State {
        var batches: [[ExtensionItem]] = []
        var outcome: RequestOutcome?
        /// Whether the consumer has seen the end (the completion's batch, or an error).
        var done = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }
    private let state = Mutex(State())

    init(id: RequestID, backend: any HostBackend) {
        self.id = id
        self.backend = backend
    }

    deinit {
        // The app dropped the stream: nobody will read the rest.
        if state.withLock({ $0.outcome == nil }) { backend.cancel(id) }
    }

    /// `RequestStream.cancel()`: the host ends the request (a no-op once it has ended).
    func cancel() {
        if state.withLock({ $0.outcome == nil }) { backend.cancel(id) }
    }

    /// A partial result (loop thread).
    func push(_ items: [ExtensionItem]) {
        let waiters = state.withLock { s in
            s.batches.append(items)
            defer { s.waiters = [] }
            return s.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// The outcome (loop thread, once).
    func end(_ outcome: RequestOutcome) {
        let waiters = state.withLock { s in
            if s.outcome == nil { s.outcome = outcome }
            defer { s.waiters = [] }
            return s.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    enum Next {
        case batch([ExtensionItem], credit: Bool)
        case finished
        case failed(RequestOutcome)
        case wait
    }

    /// The stream's next element: a partial result, then the completion's items (when there are any), then nil;
    /// or the failure the request ended with.
    func next() async throws -> [ExtensionItem]? {
        switch try await nextEvent() {
        case .batch(let items, _): return items
        default: return nil
        }
    }

    /// The next partial result (`credit: true`, credited already), the completion's items (`credit: false`) or
    /// `.finished`; throws the failure the request ended with. Never `.failed` or `.wait`.
    func nextEvent() async throws -> Next {
        while true {
            switch take() {
            case .batch(let items, let credit):
                if credit { backend.credit(id, 1) }
                return .batch(items, credit: credit)
            case .finished:
                return .finished
            case .failed(let outcome):
                switch outcome {
                case .cancelled(let error):
                    if error == .cancelledByHost, Task.isCancelled { throw CancellationError() }
                    throw RequestFailure.cancelled(error)
                case .interrupted(let reason):
                    throw RequestFailure.interrupted(reason)
                case .completed:
                    return .finished
                }
            case .wait:
                await withTaskCancellationHandler {
                    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                        let ready = state.withLock { s -> Bool in
                            if !s.batches.isEmpty || s.outcome != nil { return true }
                            s.waiters.append(continuation)
                            return false
                        }
                        if ready { continuation.resume() }
                    }
                } onCancel: { [backend, id] in
                    backend.cancel(id)
                }
            }
        }
    }

    private func take() -> Next {
        state.withLock { s in
            if s.done { return .finished }
            if !s.batches.isEmpty { return .batch(s.batches.removeFirst(), credit: true) }
            guard let outcome = s.outcome else { return .wait }
            s.done = true
            if case .completed(let items) = outcome { return items.isEmpty ? .finished : .batch(items, credit: false) }
            return .failed(outcome)
        }
    }
}

/// A streamed request's results (`Extension.stream`): its partial results in order, then the items it completes
/// with (unless there are none), then the end; or the failure it ended with.
///
/// The request is cancelled when you call `cancel()`, when the Task reading it is cancelled, or when the stream
/// and every iterator of it are released before the end. Swift gives no promise of when that is: a variable
/// holding the stream lives to the end of its scope, and in top-level code (`main.swift`) that scope is the
/// whole program. So when you stop reading early and the request should not run on, call `cancel()`:
///
///     let results = ext.stream([ExtensionItem(title: "render")])
///     for try await batch in results {
///         if isEnough(batch) { break }
///     }
///     results.cancel()  // no-op if the request has ended already
public struct RequestStream: AsyncSequence, Sendable {
    public typealias Element = [ExtensionItem]
    public typealias Failure = any Error

    let feed: StreamFeed

    /// The request's id (as `beginRequest` returns it).
    public var id: RequestID { feed.id }

    /// Cancels the request unless it has ended. Its stream then ends: with `RequestFailure.cancelled`
    /// (`ExtensionError.cancelledByHost`), or with the outcome that arrived first.
    public func cancel() { feed.cancel() }

    public func makeAsyncIterator() -> Iterator { Iterator(feed: feed) }

    /// Hands out the stream's batches; see `RequestStream`.
    public struct Iterator: AsyncIteratorProtocol {
        let feed: StreamFeed

        public mutating func next() async throws -> [ExtensionItem]? { try await feed.next() }
    }
}

extension Extension {
    /// Starts a request and returns its results as they come: each partial result the extension sends
    /// (`context.send`), in order, then the items it completes with (unless there are none), then the end. Every
    /// partial result comes before the end, never after.
    ///
    /// The extension is slowed to the pace you read at: it may run at most 16 partial results ahead. Calling
    /// `cancel()` on the stream, cancelling the reading Task, or releasing the stream before its end cancels the
    /// request (see `RequestStream` for top-level code).
    ///
    /// - Parameters:
    ///   - items: The input items.
    ///   - deadline: As for `beginRequest`.
    /// - Returns: A stream that throws `RequestFailure.cancelled` when the request is cancelled (by the
    ///   extension, or by `cancel()`), `RequestFailure.interrupted` when it is interrupted (after the partial
    ///   results that arrived first), and `CancellationError` when the reading Task is cancelled.
    public func stream(_ items: [ExtensionItem], deadline: Duration? = nil) -> RequestStream {
        let id = RequestID()
        let feed = StreamFeed(id: id, backend: host.backend)
        let backend = host.backend
        // The feed is held by the stream only: once the app drops the stream, partial results are credited at
        // once and the request is cancelled (StreamFeed.deinit).
        submit(
            id: id, items: items, deadline: deadline.map(seconds), onWorkerAssigned: nil,
            deliver: { [weak feed] outcome in feed?.end(outcome) },
            progress: { [weak feed] batch in
                if let feed { feed.push(batch) } else { backend.credit(id, 1) }
            })
        return RequestStream(feed: feed)
    }

    /// Runs one request like `perform(_:deadline:)`, calling `progress` with each partial result the extension
    /// sends, in order, in the caller's isolation: on the main actor from `@MainActor` code, in the calling
    /// actor from an actor, so the closure need not be `@Sendable` and may change the caller's state directly:
    ///
    ///     var pages = 0
    ///     let final = try await ext.perform(items) { _ in pages += 1 }
    ///
    /// Every call has returned before this one returns or throws. The extension is slowed to `progress`'s pace
    /// (at most 16 partial results ahead).
    ///
    /// - Throws: As `perform(_:deadline:)`: `RequestFailure.cancelled`, `RequestFailure.interrupted`, or
    ///   `CancellationError` when the calling Task is cancelled (which cancels the request).
    public func perform(_ items: [ExtensionItem], deadline: Duration? = nil,
                        isolation: isolated (any Actor)? = #isolation,
                        progress: ([ExtensionItem]) -> Void) async throws -> [ExtensionItem]
    {
        let results = stream(items, deadline: deadline)
        while true {
            switch try await results.feed.nextEvent() {
            case .batch(let batch, credit: true): progress(batch)
            case .batch(let batch, credit: false): return batch
            default: return []
            }
        }
    }
}
