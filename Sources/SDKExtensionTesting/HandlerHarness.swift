// Runs a handler in the test's own process: no host, no worker, no socket. The handler gets a real
// ExtensionContext, as the worker runtime would give it; the harness plays the host (cancel, wait, time out) and
// the app's host services (fakes the test gives, each answering `context.callHost`).
import SDKWire
import Synchronization
@_exported import SDKExtension

/// How a request ended under the harness.
public enum HandlerOutcome: Sendable, Equatable {
    /// `completeRequest(returningItems:)` with these items.
    case completed([ExtensionItem])
    /// `cancelRequest(withError:)` with this error (`ExtensionError.cancelledByHost` after `HandlerRun.cancel()`).
    case cancelled(ExtensionError)
    /// Not finished within the time waited.
    case timedOut
}

/// A fake of one of the app's host services: what `context.callHost(name, items)` gets back (or throws; an
/// `ExtensionError` reaches the handler as it is). Runs in a Task of its own, cancelled if the handler gives up.
public typealias FakeHostService = @Sendable (_ items: [ExtensionItem]) async throws -> [ExtensionItem]

/// One request running under the harness.
public final class HandlerRun: Sendable {
    /// The request's identifier, as its context has it.
    public let requestID = RequestID()
    private let state = Mutex<State>(State())
    private let weakContext = WeakContext()

    private struct State {
        var outcome: HandlerOutcome?
        var partials: [[ExtensionItem]] = []
        var context: ExtensionContext?
        var waiters: [Int: CheckedContinuation<HandlerOutcome, Never>] = [:]
        var nextWaiter = 0
        var calls: [(service: String, items: [ExtensionItem])] = []
        var running: [Int64: Task<Void, Never>] = [:]
        /// Calls whose cancel came before the call itself.
        var cancelledEarly: Set<Int64> = []
        /// Calls whose fake finished before its Task was recorded in `running`.
        var finishedEarly: Set<Int64> = []
    }

    private final class WeakContext: @unchecked Sendable {
        weak var value: ExtensionContext?
    }

    init(items: [ExtensionItem], services: [String: FakeHostService], maxHostCalls: Int,
         start: (ExtensionContext) -> Void)
    {
        // The app's side of host calls: each call runs its fake (or fails as an unprovided service does).
        let callerBox = CallerBox()
        let requestID = self.requestID
        let caller = HostCaller(maxInFlight: maxHostCalls) { [weak self] message in
            guard let self else { return true }
            switch message {
            case .hostCall(_, let call, let service, let items):
                // A cancel may overtake its call (the handler's Task was cancelled as the call started).
                let overtaken = self.state.withLock { s -> Bool in
                    s.calls.append((service, items))
                    return s.cancelledEarly.remove(call) != nil
                }
                if overtaken { return true }
                let fake = services[service]
                let task = Task { [weak self] in
                    let answer: Message
                    do {
                        guard let fake else { throw ExtensionError.serviceNotProvided(service) }
                        answer = .hostCallResult(id: requestID, call: call, items: try await fake(items))
                    } catch {
                        answer = .hostCallError(id: requestID, call: call, error: .thrown(by: service, error))
                    }
                    callerBox.value?.answer(answer)
                    // Done: it leaves `running`, or, if it finished before it was put there, says so.
                    self?.state.withLock { s in
                        if s.running.removeValue(forKey: call) == nil { s.finishedEarly.insert(call) }
                    }
                }
                self.state.withLock { s in
                    if s.finishedEarly.remove(call) == nil { s.running[call] = task }
                }
            case .hostCallCancel(_, let call):
                let task = self.state.withLock { s -> Task<Void, Never>? in
                    guard let task = s.running.removeValue(forKey: call) else {
                        s.cancelledEarly.insert(call)
                        return nil
                    }
                    return task
                }
                task?.cancel()
            default:
                break
            }
            return true
        }
        callerBox.value = caller
        let context = ExtensionContext(
            requestID: requestID, inputItems: items,
            finish: { [weak self] message in self?.finished(message) },
            partial: { [weak self] message in
                guard let self, case .partial(_, let items) = message else { return }
                // Taken at once, as by an app that keeps up: the context gets its credit back.
                self.state.withLock { $0.partials.append(items) }
                self.state.withLock { $0.context }?.credit(1)
            },
            hostCaller: caller)
        weakContext.value = context
        state.withLock { $0.context = context }
        start(context)
    }

    /// The host calls the handler made (`context.callHost`) so far, in order: each service's name and items.
    public var hostCalls: [(service: String, items: [ExtensionItem])] { state.withLock { $0.calls } }

    private final class CallerBox: @unchecked Sendable {
        // Set once, before the context exists; read by the fakes' Tasks.
        var value: HostCaller?
    }

    /// The partial results the handler sent (`context.send`) so far, in order.
    public var partialResults: [[ExtensionItem]] { state.withLock { $0.partials } }

    private func finished(_ message: Message) {
        let outcome: HandlerOutcome
        switch message {
        case .complete(_, let items): outcome = .completed(items)
        case .cancelled(_, let error): outcome = .cancelled(error)
        default: return
        }
        let waiters = state.withLock { s -> [CheckedContinuation<HandlerOutcome, Never>] in
            s.outcome = outcome
            s.context = nil  // from here on, only the handler can keep the context alive
            for task in s.running.values { task.cancel() }  // as the host cancels a request's calls at its end
            s.running = [:]
            defer { s.waiters = [:] }
            return Array(s.waiters.values)
        }
        for waiter in waiters { waiter.resume(returning: outcome) }
    }

    /// Cancels the request as the host does: `isCancelled` becomes true and an async handler's Task is cancelled.
    public func cancel() {
        state.withLock { $0.context }?.markCancelledByHost()
    }

    /// The outcome, waiting up to `timeout` for it; `.timedOut` if the handler has not finished by then (it may
    /// still finish later, and a later call returns that).
    public func outcome(timeout: Duration = .seconds(5)) async -> HandlerOutcome {
        let ticket = state.withLock { s -> Int? in
            if s.outcome != nil { return nil }
            s.nextWaiter += 1
            return s.nextWaiter
        }
        guard let ticket else { return state.withLock { $0.outcome! } }
        let timer = Task { [weak self] in
            try? await Task.sleep(for: timeout)
            guard !Task.isCancelled else { return }
            self?.state.withLock { $0.waiters.removeValue(forKey: ticket) }?.resume(returning: .timedOut)
        }
        defer { timer.cancel() }
        return await withCheckedContinuation { continuation in
            let early = state.withLock { s -> HandlerOutcome? in
                if let outcome = s.outcome { return outcome }
                s.waiters[ticket] = continuation
                return nil
            }
            if let early { continuation.resume(returning: early) }
        }
    }

    /// Whether the request's context is gone within `timeout` after the request ended: false if the handler (or
    /// something it started) still holds it, which the worker runtime would report as a leak.
    public func contextIsReleased(within timeout: Duration = .seconds(1)) async -> Bool {
        await waitWhile(timeout: timeout) { weakContext.value != nil }
        return weakContext.value == nil
    }
}

/// Runs `RequestHandler`s and `AsyncRequestHandler`s in process, as the worker runtime would.
///
/// ```swift
/// let run = HandlerHarness.start(MyHandler(), items: [ExtensionItem(title: "hi")])
/// #expect(await run.outcome() == .completed([ExtensionItem(title: "HI")]))
/// #expect(await run.contextIsReleased())
/// ```
public enum HandlerHarness {
    /// Starts one request on a synchronous handler (on a global queue, as the runtime does unless the handler
    /// `runsInline`, in which case on this thread).
    ///
    /// `services` fake the app's host services by name (`context.callHost`); a call to any other fails as a call
    /// to a service the app does not provide. `maxHostCalls` is the manifest's MaxHostCallsInFlight.
    public static func start<Handler: RequestHandler>(_ handler: Handler, items: [ExtensionItem],
                                                      services: [String: FakeHostService] = [:],
                                                      maxHostCalls: Int = 16) -> HandlerRun {
        HandlerRun(items: items, services: services, maxHostCalls: maxHostCalls) { context in
            if Handler.runsInline {
                handler.beginRequest(with: context)
            } else {
                DispatchQueue.global().async { handler.beginRequest(with: context) }
            }
        }
    }

    /// Starts one request on an async handler, in a Task of its own that `HandlerRun.cancel()` cancels. A handler
    /// that returns without finishing has the request finished for it, as in a worker.
    public static func start<Handler: AsyncRequestHandler>(_ handler: Handler, items: [ExtensionItem],
                                                           services: [String: FakeHostService] = [:],
                                                           maxHostCalls: Int = 16) -> HandlerRun {
        HandlerRun(items: items, services: services, maxHostCalls: maxHostCalls) { context in
            context.runAsync { await handler.beginRequest(with: $0) }
        }
    }

    /// Runs one request to its outcome (or `.timedOut`).
    public static func run<Handler: RequestHandler>(
        _ handler: Handler, items: [ExtensionItem], services: [String: FakeHostService] = [:], timeout: Duration = .seconds(5)
    ) async -> HandlerOutcome {
        await start(handler, items: items, services: services).outcome(timeout: timeout)
    }

    /// Runs one request of an async handler to its outcome (or `.timedOut`).
    public static func run<Handler: AsyncRequestHandler>(
        _ handler: Handler, items: [ExtensionItem], services: [String: FakeHostService] = [:], timeout: Duration = .seconds(5)
    ) async -> HandlerOutcome {
        await start(handler, items: items, services: services).outcome(timeout: timeout)
    }
}

import Dispatch
