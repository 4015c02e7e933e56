// Host services from the extension's side: `context.callHost("name", items)` asks the app for something the
// sandbox keeps from the extension (a document's parts, a network fetch), and waits for its answer. Every call
// ends exactly once: with the app's items, with an error (the service is not listed or not provided, the app's
// handler threw, too many calls), or cancelled (the handler's Task was cancelled, the host cancelled the request,
// the request finished first). The wire: Messages.swift, "Host services".
import SDKWire
import Synchronization
import Dispatch

/// The calls of one worker's requests to the host's services. Call numbers are the worker's: unique across its
/// requests, so an answer names one call only.
package final class HostCaller: Sendable {
    /// Sends `hostCall` and `hostCallCancel` (the runtime: to the host; the test harness: to its fake services);
    /// false if it could not (a call too large for a frame).
    private let send: @Sendable (Message) -> Bool
    /// Calls one request may have in flight (the manifest's MaxHostCallsInFlight).
    package let maxInFlight: Int

    private struct Waiting {
        let requestID: RequestID
        let resolve: @Sendable (Result<[ExtensionItem], any Error>) -> Void
    }
    private struct State {
        var nextCall: Int64 = 1
        var waiting: [Int64: Waiting] = [:]
        /// Requests that finished or were cancelled: a call they make now ends at once.
        var ended: Set<RequestID> = []
    }
    private let state = Mutex(State())

    package init(maxInFlight: Int, send: @escaping @Sendable (Message) -> Bool) {
        self.maxInFlight = max(1, maxInFlight)
        self.send = send
    }

    /// Starts a call; `resolve` runs exactly once (perhaps before this returns). Returns the call's number, or nil
    /// if it ended at once.
    @discardableResult
    package func start(_ requestID: RequestID, service: String, items: [ExtensionItem],
                       resolve: @escaping @Sendable (Result<[ExtensionItem], any Error>) -> Void) -> Int64? {
        let started = state.withLock { s -> Result<Int64, ExtensionError> in
            if s.ended.contains(requestID) { return .failure(.requestEnded) }
            let inFlight = s.waiting.values.reduce(0) { $0 + ($1.requestID == requestID ? 1 : 0) }
            if inFlight >= maxInFlight { return .failure(.tooManyHostCalls(maxInFlight)) }
            let call = s.nextCall
            s.nextCall += 1
            s.waiting[call] = Waiting(requestID: requestID, resolve: resolve)
            return .success(call)
        }
        switch started {
        case .failure(let error):
            resolve(.failure(error))
            return nil
        case .success(let call):
            guard send(.hostCall(id: requestID, call: call, service: service, items: items)) else {
                // Never sent (too large for a frame, say): it ends here, unless its request's end took it first.
                state.withLock { $0.waiting.removeValue(forKey: call) }?.resolve(.failure(ExtensionError.callNotSent))
                return nil
            }
            return call
        }
    }

    /// The host answered (`hostCallResult` or `hostCallError`). An answer for a call no longer waited for (given
    /// up, or its request ended) is dropped.
    package func answer(_ message: Message) {
        let call: Int64, result: Result<[ExtensionItem], any Error>
        switch message {
        case .hostCallResult(_, let c, let items): (call, result) = (c, .success(items))
        case .hostCallError(_, let c, let error): (call, result) = (c, .failure(error))
        default: return
        }
        state.withLock { $0.waiting.removeValue(forKey: call) }?.resolve(result)
    }

    /// The extension gave up on `call` (its Task was cancelled): it ends cancelled, and the host is told.
    package func cancel(_ call: Int64) {
        guard let waiting = state.withLock({ $0.waiting.removeValue(forKey: call) }) else { return }
        _ = send(.hostCallCancel(id: waiting.requestID, call: call))
        waiting.resolve(.failure(CancellationError()))
    }

    /// The request ended: its calls still waiting end (cancelled if the host cancelled it, else with
    /// `requestEnded`), and any it makes from now on end at once. `tellHost`: send `hostCallCancel` for each
    /// (the host cancelled the request but still runs its calls until it hears; a request that finished has
    /// had its calls cancelled by the host already).
    package func end(_ requestID: RequestID, cancelled: Bool, tellHost: Bool) {
        let ended = state.withLock { s -> [(Int64, Waiting)] in
            s.ended.insert(requestID)
            let mine = s.waiting.filter { $0.value.requestID == requestID }
            for (call, _) in mine { s.waiting[call] = nil }
            return mine.sorted { $0.key < $1.key }
        }
        for (call, waiting) in ended {
            if tellHost { _ = send(.hostCallCancel(id: requestID, call: call)) }
            waiting.resolve(.failure(cancelled ? CancellationError() : ExtensionError.requestEnded))
        }
    }

    /// The request's context is gone: nothing of it is kept.
    package func forget(_ requestID: RequestID) { _ = state.withLock { $0.ended.remove(requestID) } }

    /// Calls waiting now (tests).
    package var waitingCount: Int { state.withLock { $0.waiting.count } }
}

/// One call's state between the waiting code and its cancellation handler, which may run in either order.
private final class PendingCall: Sendable {
    private let state = Mutex<(call: Int64?, cancelled: Bool)>((nil, false))

    /// The call started as `call`: true if it was cancelled meanwhile (the caller cancels it now).
    func started(_ call: Int64?) -> Bool {
        state.withLock { s in
            s.call = call
            return s.cancelled
        }
    }

    /// Cancelled: the call to give up on, if it has started.
    func cancel() -> Int64? {
        state.withLock { s in
            s.cancelled = true
            return s.call
        }
    }
}

extension ExtensionContext {
    /// Asks the app's service `service` (one the extension's manifest lists under `HostServices`) with `items`,
    /// and returns its answer. Items may carry files both ways.
    ///
    /// - Throws: `ExtensionError` when the service is not listed or not provided by the app (domain "SDKHost"),
    ///   when the app's handler threw (its error, or domain "SDKHost" code 13), when more than
    ///   `MaxHostCallsInFlight` calls of this request are waiting (domain "SDKExtension" code 4), or when the
    ///   request has ended (code 5); `CancellationError` when the calling Task is cancelled (as a host cancel
    ///   of the request does), which also cancels the app's handler.
    public func callHost(_ service: String, _ items: [ExtensionItem] = []) async throws -> [ExtensionItem] {
        guard let caller = hostCaller else { throw ExtensionError.noHost }
        try Task.checkCancellation()
        let pending = PendingCall()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[ExtensionItem], any Error>) in
                let call = caller.start(requestID, service: service, items: items) { continuation.resume(with: $0) }
                if pending.started(call), let call { caller.cancel(call) }
            }
        } onCancel: {
            if let call = pending.cancel() { caller.cancel(call) }
        }
    }

    /// The blocking form of `callHost(_:_:) async`, for synchronous handlers: waits on this thread for the answer.
    /// A host cancel of the request ends the wait (with `CancellationError`). Never call it from an inline
    /// (`runsInline`) handler: the thread it blocks is the one that reads the answer.
    public func callHost(_ service: String, _ items: [ExtensionItem] = []) throws -> [ExtensionItem] {
        guard let caller = hostCaller else { throw ExtensionError.noHost }
        let done = DispatchSemaphore(value: 0)
        let outcome = Mutex<Result<[ExtensionItem], any Error>?>(nil)
        caller.start(requestID, service: service, items: items) { result in
            outcome.withLock { $0 = result }
            done.signal()
        }
        done.wait()
        return try outcome.withLock { $0! }.get()
    }
}
