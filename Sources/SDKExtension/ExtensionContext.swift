// ExtensionContext: one request as the extension sees it. Finishing is idempotent: the first of
// completeRequest/cancelRequest wins, later calls are logged and ignored. Partial results (`send`) go out
// before the request finishes, within the host's credit: at most `streamWindow` not yet taken by the app, so a
// handler that produces faster than the app reads waits in `send` instead of piling frames up anywhere.
import SDKWire
import Synchronization
import Dispatch

/// One request inside the extension: its input, its cancellation state, and how to finish it.
public final class ExtensionContext: Sendable {
    /// The request's identifier, as the host knows it.
    public let requestID: RequestID
    /// The items the host sent.
    public let inputItems: [ExtensionItem]

    private let state = Mutex<State>(State())
    private let finishBody: @Sendable (Message) -> Void
    /// Sends a `partial` message (nil: partial results are dropped, as in a context made without a host).
    private let partialBody: (@Sendable (Message) -> Void)?
    /// Called when the context is released, after its request ended (the runtime's leak check).
    private let onRelease: (@Sendable (RequestID) -> Void)?
    /// Makes this request's calls to the host's services (HostCalls.swift); nil in a context made without a host.
    package let hostCaller: HostCaller?

    struct State {
        var finished = false
        var cancelledByHost = false
        var task: Task<Void, Never>?
        /// Partial results the host lets this request send before it credits some back.
        var credits = streamWindow
        /// `send` calls waiting for credit.
        var creditWaiters: [CreditWaiter] = []
    }

    enum CreditWaiter {
        case thread(DispatchSemaphore)
        case task(CheckedContinuation<Void, Never>)

        func wake() {
            switch self {
            case .thread(let semaphore): semaphore.signal()
            case .task(let continuation): continuation.resume()
            }
        }
    }

    package init(requestID: RequestID, inputItems: [ExtensionItem], finish: @escaping @Sendable (Message) -> Void,
                 partial: (@Sendable (Message) -> Void)? = nil, onRelease: (@Sendable (RequestID) -> Void)? = nil,
                 hostCaller: HostCaller? = nil)
    {
        self.hostCaller = hostCaller
        self.requestID = requestID
        self.inputItems = inputItems
        self.finishBody = finish
        self.partialBody = partial
        self.onRelease = onRelease
    }

    deinit {
        hostCaller?.forget(requestID)
        onRelease?(requestID)
    }

    /// True once the host has cancelled this request. Long-running work should check it and stop with
    /// `cancelRequest(withError:)`. Async handlers also see Task cancellation.
    public var isCancelled: Bool { state.withLock { $0.cancelledByHost } }

    /// True once the request has been completed or cancelled from this side.
    public var isFinished: Bool { state.withLock { $0.finished } }

    /// Completes the request with `items`. A second call, or a call after `cancelRequest`, is logged and ignored.
    public func completeRequest(returningItems items: [ExtensionItem]) {
        finish(.complete(id: requestID, items: items), verb: "completeRequest")
    }

    /// Cancels the request, reporting `error` to the host. Ignored (and logged) if the request already finished.
    public func cancelRequest(withError error: ExtensionError) {
        finish(.cancelled(id: requestID, error: error), verb: "cancelRequest")
    }

    /// Sends `items` to the host as a partial result, before the request finishes. The app sees it through its
    /// progress handler or stream, before the request's one terminal callback. Waits (blocking this thread)
    /// while the app has not yet taken 16 earlier partial results: call it from a handler's own thread, never
    /// from an inline (`runsInline`) `beginRequest`. Async handlers should use the async overload.
    ///
    /// - Returns: false, dropping the items, when the request has finished or the host cancelled it.
    @discardableResult
    public func send(_ items: [ExtensionItem]) -> Bool {
        while true {
            switch takeCredit(orWait: nil) {
            case .granted: return deliverPartial(items)
            case .ended: return endedDrop()
            case .wait:
                let semaphore = DispatchSemaphore(value: 0)
                if case .wait = takeCredit(orWait: .thread(semaphore)) { semaphore.wait() }
            }
        }
    }

    /// Sends `items` to the host as a partial result; suspends while the app has not yet taken 16 earlier ones.
    /// See the synchronous `send(_:)`.
    ///
    /// - Returns: false, dropping the items, when the request has finished or the host cancelled it.
    @discardableResult
    public func send(_ items: [ExtensionItem]) async -> Bool {
        while true {
            switch takeCredit(orWait: nil) {
            case .granted: return deliverPartial(items)
            case .ended: return endedDrop()
            case .wait:
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    if case .wait = takeCredit(orWait: .task(continuation)) { return }
                    continuation.resume()
                }
            }
        }
    }

    private enum Credit { case granted, ended, wait }

    /// Takes one credit if there is one. With none left, registers `waiter` (if given) to be woken by the next
    /// credit, the end or a cancel, and returns `.wait`; a waiter is never registered for another answer.
    private func takeCredit(orWait waiter: CreditWaiter?) -> Credit {
        state.withLock { s in
            if s.finished || s.cancelledByHost { return .ended }
            if s.credits > 0 {
                // With a waiter this only asks whether to wait: the caller retries and takes it then.
                if waiter == nil { s.credits -= 1 }
                return .granted
            }
            if let waiter { s.creditWaiters.append(waiter) }
            return .wait
        }
    }

    private func deliverPartial(_ items: [ExtensionItem]) -> Bool {
        partialBody?(.partial(id: requestID, items: items))
        return true
    }

    private func endedDrop() -> Bool {
        WorkerLog.write("send on request \(requestID) that has finished or was cancelled; dropped")
        return false
    }

    /// The host took `count` partial results: wake the senders waiting for credit.
    package func credit(_ count: Int) {
        state.withLock { $0.credits = min($0.credits + max(count, 0), streamWindow) }
        wakeCreditWaiters()
    }

    private func finish(_ message: Message, verb: String) {
        let first = state.withLock { s -> Bool in
            if s.finished { return false }
            s.finished = true
            return true
        }
        guard first else {
            WorkerLog.write("\(verb) on request \(requestID) that already finished; ignored")
            return
        }
        wakeCreditWaiters()
        // Its calls still waiting end now; the host cancels them on its side when it reads this message.
        hostCaller?.end(requestID, cancelled: false, tellHost: false)
        finishBody(message)
    }

    // Not inlined: inlined into the runtime's read loop, the metadata of the waiters' continuation type was made
    // (and a protocol conformance looked up) at every worker's start, before any request, streamed or not.
    @inline(never)
    private func wakeCreditWaiters() {
        let waiters = state.withLock { s in
            defer { s.creditWaiters = [] }
            return s.creditWaiters
        }
        for waiter in waiters { waiter.wake() }
    }

    /// The host cancelled: raise the flag, cancel the handler's Task, if any, and wake senders waiting for credit.
    package func markCancelledByHost() {
        let task = state.withLock { s -> Task<Void, Never>? in
            s.cancelledByHost = true
            return s.task
        }
        task?.cancel()
        wakeCreditWaiters()
        hostCaller?.end(requestID, cancelled: true, tellHost: true)
    }

    package func attach(_ task: Task<Void, Never>) {
        let cancelled = state.withLock { s -> Bool in
            s.task = task
            return s.cancelledByHost
        }
        if cancelled { task.cancel() }
    }
}

extension ExtensionContext {
    /// Runs an async handler for this request in a Task of its own, as the runtime and the test harness both do:
    /// a host cancel cancels the Task, and a handler that returns without finishing the request has it finished
    /// for it (cancelled by the host if it was, else cancelled with an error saying so). `ended` runs when the
    /// Task is over.
    @inline(never)  // as wakeCreditWaiters: a synchronous extension never pays for the Task's metadata
    package func runAsync(_ body: @escaping @Sendable (ExtensionContext) async -> Void,
                          ended: (@Sendable () -> Void)? = nil)
    {
        attach(Task.detached { [self] in
            await body(self)
            if !isFinished {
                if isCancelled {
                    cancelRequest(withError: .cancelledByHost)
                } else {
                    WorkerLog.write("handler returned without finishing request \(requestID)")
                    cancelRequest(withError: ExtensionError(
                        domain: "SDKExtension", code: 2, message: "the handler returned without completing the request"))
                }
            }
            ended?()
        })
    }
}
