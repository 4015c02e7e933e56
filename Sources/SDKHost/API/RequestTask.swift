// RequestTask: a handle on one request started with `Extension.start`, for callers that want its id and worker
// pid while it runs, and `perform`'s implementation. EndedRequest: one element of `Extension.outcomes()`.
import SDKWire
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One request's end, as `Extension.outcomes()` yields it.
public struct EndedRequest: Sendable, Equatable {
    public let id: RequestID
    public let outcome: RequestOutcome
}

/// A request in flight (or ended), returned by `Extension.start`. Its outcome goes only here.
public final class RequestTask: Sendable {
    /// The request's identifier, as handlers and logs name it.
    public let id: RequestID
    let backend: any HostBackend
    private let state = Mutex<(outcome: RequestOutcome?, pid: pid_t?, waiters: [CheckedContinuation<RequestOutcome, Never>])>(
        (nil, nil, []))

    init(id: RequestID, backend: any HostBackend) {
        self.id = id
        self.backend = backend
    }

    /// The pid of the worker the request was sent to: while it runs, and after it ended (the worker that served
    /// it). Nil until a worker has it (it may wait for a spawn, or never reach one).
    public var pid: pid_t? { state.withLock { $0.pid } }

    /// Cancels the request (as `Extension.cancelRequest`); a no-op once it has ended.
    public func cancel() { backend.cancel(id) }

    /// The request's outcome, waiting for it. Never throws; cancelling the waiting Task does not cancel the request.
    public var outcome: RequestOutcome {
        get async {
            await withCheckedContinuation { continuation in
                let ready = state.withLock { s -> RequestOutcome? in
                    if let outcome = s.outcome { return outcome }
                    s.waiters.append(continuation)
                    return nil
                }
                if let ready { continuation.resume(returning: ready) }
            }
        }
    }

    /// The completed items, as `perform` returns them.
    ///
    /// - Throws: `CancellationError` when the waiting Task is cancelled (which cancels the request);
    ///   `RequestFailure.cancelled` when the extension cancelled; `RequestFailure.interrupted` when interrupted.
    public var value: [ExtensionItem] {
        get async throws {
            let outcome = await withTaskCancellationHandler { await self.outcome } onCancel: { self.cancel() }
            switch outcome {
            case .completed(let items):
                return items
            case .cancelled(let error):
                if error == .cancelledByHost, Task.isCancelled { throw CancellationError() }
                throw RequestFailure.cancelled(error)
            case .interrupted(let reason):
                throw RequestFailure.interrupted(reason)
            }
        }
    }

    func assigned(_ pid: pid_t) { state.withLock { $0.pid = pid } }

    func ended(_ outcome: RequestOutcome) {
        let waiters = state.withLock { s -> [CheckedContinuation<RequestOutcome, Never>] in
            guard s.outcome == nil else { return [] }
            s.outcome = outcome
            defer { s.waiters = [] }
            return s.waiters
        }
        for waiter in waiters { waiter.resume(returning: outcome) }
    }
}

/// A Duration as seconds.
func seconds(_ duration: Duration) -> Double {
    let (s, attoseconds) = duration.components
    return Double(s) + Double(attoseconds) / 1e18
}
