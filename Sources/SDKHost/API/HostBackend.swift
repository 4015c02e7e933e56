// HostBackend: what an ExtensionHost delegates to. The embedded engine is one backend; the daemon connection
// is the other. Both take requests without blocking and deliver exactly one outcome per request.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix

/// A request as handed to a backend.
package struct SubmittedRequest: Sendable {
    package let id: RequestID
    package let extensionID: String
    package let items: [ExtensionItem]
    /// Seconds; nil for the extension's own deadline.
    package let deadline: Double?
    package let onWorkerAssigned: (@Sendable (pid_t) -> Void)?
    package let deliver: @Sendable (RequestOutcome) -> Void
    /// Takes each partial result, on the backend's loop thread, before `deliver`; the taker calls the backend's
    /// `credit` once the app has it. Nil: partial results are dropped (and credited at once).
    package let progress: (@Sendable ([ExtensionItem]) -> Void)?
    /// The daemon client app that sent it (uid and name); nil in an embedded host.
    package var app: String?
    /// The daemon: the client's begin payload, sent to the worker as it is (its id rewritten) instead of encoding
    /// `items` again.
    package var forwardedBegin: ForwardedFrame?
    /// The daemon: takes a completion with the worker's payload and where its id is in it, to send on as it is,
    /// in place of `deliver` (which still takes every other outcome, and a completion whose id cannot be
    /// rewritten in place). Called on the loop thread, exactly once if at all.
    package var deliverForwarded: (@Sendable (RequestOutcome, UnsafeRawBufferPointer, Range<Int>) -> Void)?
    /// Answers the host calls its worker makes (HostServices.swift); nil: every call ends with an error.
    package var services: (any HostServiceProvider)?
    /// Whether the engine's `pid(for:)` answers for it. The daemon turns it off: its clients learn the pid from
    /// `assigned`, and each request then saves the engine a locked table insert and removal.
    package var publishesPid = true

    package init(id: RequestID, extensionID: String, items: [ExtensionItem], deadline: Double?,
                 onWorkerAssigned: (@Sendable (pid_t) -> Void)?, deliver: @escaping @Sendable (RequestOutcome) -> Void,
                 progress: (@Sendable ([ExtensionItem]) -> Void)? = nil, app: String? = nil)
    {
        self.progress = progress
        self.app = app
        self.id = id
        self.extensionID = extensionID
        self.items = items
        self.deadline = deadline
        self.onWorkerAssigned = onWorkerAssigned
        self.deliver = deliver
    }
}

/// Where `CallbackBatcher` hands its calls over: a loop that can run something at the end of its turn.
protocol TurnEnding: Sendable {
    /// On the loop thread (where a backend's `deliver` runs): runs `body` there once the loop has handled everything
    /// ready, before it waits again. Anywhere else: runs `body` now.
    func atEndOfTurn(_ body: @escaping @Sendable () -> Void)
}

protocol HostBackend: TurnEnding, AnyObject {
    /// Identifiers of the extensions this backend serves, sorted.
    var extensionIdentifiers: [String] { get }
    /// The same extensions with their extension points.
    var extensions: [ExtensionInfo] { get }
    /// Embedded, or which daemon.
    var mode: HostMode { get }
    /// A new stream of worker lifecycle events.
    func workerEvents() -> AsyncStream<WorkerEvent>
    /// Why `identifier` cannot be used, or nil if it can.
    func lookupProblem(_ identifier: String) -> HostError?
    /// Starts a request; never blocks.
    func submit(_ request: SubmittedRequest)
    /// Cancels a request; never blocks.
    func cancel(_ id: RequestID)
    /// The app has taken `count` partial results of `id`: its worker may send as many more. Never blocks.
    func credit(_ id: RequestID, _ count: Int)
    /// The worker pid of an in-flight request.
    func pid(for id: RequestID) -> pid_t?
    /// Stops; `completion` runs when everything is released.
    func shutdown(completion: @escaping @Sendable () -> Void)
    /// The status (`sdk-host status`); nil if it cannot be had (the daemon is unreachable).
    func status(_ body: @escaping @Sendable (HostStatus?) -> Void)
    /// Starts a handshaken worker for the extension (for this app, through the daemon) unless one is ready.
    func prewarm(_ extensionID: String, _ done: @escaping @Sendable (Result<pid_t, RequestFailure>) -> Void)
}

extension EventLoop {
    /// `HostBackend.atEndOfTurn` for a backend that runs on this loop.
    func atEndOfTurn(_ body: @escaping @Sendable () -> Void) {
        if inLoop && !runningInline { runBeforeSleeping(body) } else { body() }
    }
}

extension InterruptionReason {
    /// The wire form used between daemon and client: {kind, code?, detail?}.
    package var plist: PlistValue {
        switch self {
        case .signal(let s): ["kind": "signal", "code": .integer(Int64(s))]
        case .exited(let c): ["kind": "exit", "code": .integer(Int64(c))]
        case .hang: ["kind": "hang"]
        case .protocolViolation(let d): ["kind": "protocol", "detail": .string(d)]
        case .disconnected: ["kind": "disconnected"]
        case .launchFailed(let d): ["kind": "launch", "detail": .string(d)]
        case .hostShutdown: ["kind": "shutdown"]
        case .timedOut: ["kind": "timedOut"]
        case .overloaded: ["kind": "overloaded"]
        case .quarantined: ["kind": "quarantined"]
        }
    }

    /// Parses the wire form; an unknown kind reads as a protocol problem rather than failing.
    package init(plist: PlistValue) {
        let code = Int32(truncatingIfNeeded: plist["code"]?.integerValue ?? 0)
        let detail = plist["detail"]?.stringValue ?? ""
        switch plist["kind"]?.stringValue {
        case "signal": self = .signal(code)
        case "exit": self = .exited(code)
        case "hang": self = .hang
        case "protocol": self = .protocolViolation(detail)
        case "disconnected": self = .disconnected
        case "launch": self = .launchFailed(detail)
        case "shutdown": self = .hostShutdown
        case "timedOut": self = .timedOut
        case "overloaded": self = .overloaded
        case "quarantined": self = .quarantined
        default: self = .protocolViolation("unknown interruption reason \(plist)")
        }
    }
}
