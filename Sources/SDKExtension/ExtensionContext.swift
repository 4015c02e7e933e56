// ExtensionContext: one request as the extension sees it. Finishing is idempotent: the first of
// completeRequest/cancelRequest wins, later calls are logged and ignored.
import SDKWire
import Synchronization

/// One request inside the extension: its input, its cancellation state, and how to finish it.
public final class ExtensionContext: Sendable {
    /// The request's identifier, as the host knows it.
    public let requestID: RequestID
    /// The items the host sent.
    public let inputItems: [ExtensionItem]

    private let state = Mutex<State>(State())
    private let finishBody: @Sendable (Message) -> Void
    /// Called when the context is released, after its request ended (the runtime's leak check).
    private let onRelease: (@Sendable (RequestID) -> Void)?

    struct State {
        var finished = false
        var cancelledByHost = false
        var task: Task<Void, Never>?
    }

    package init(requestID: RequestID, inputItems: [ExtensionItem], finish: @escaping @Sendable (Message) -> Void,
                 onRelease: (@Sendable (RequestID) -> Void)? = nil)
    {
        self.requestID = requestID
        self.inputItems = inputItems
        self.finishBody = finish
        self.onRelease = onRelease
    }

    deinit { onRelease?(requestID) }

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
        finishBody(message)
    }

    /// The host cancelled: raise the flag and cancel the handler's Task, if any.
    package func markCancelledByHost() {
        let task = state.withLock { s -> Task<Void, Never>? in
            s.cancelledByHost = true
            return s.task
        }
        task?.cancel()
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
