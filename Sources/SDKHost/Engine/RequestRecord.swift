// RequestRecord and RequestQueue: one request from `beginRequest` until its terminal outcome, and the per-extension
// queue of requests waiting for a worker. The queue is intrusive (each record carries its links), so append,
// pop and removing a cancelled or timed-out request from the middle are all O(1), and a request that ends while
// queued leaves the queue at once with everything it held.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix

/// The longest deadline the host honours, in seconds (about three years). Peers' numbers are clamped to it.
package let maximumSeconds: Double = 100_000_000

/// Seconds to nanoseconds for timers: negative and NaN become 0, anything past `maximumSeconds` is clamped, so
/// a peer's number can never trap the conversion.
func nanoseconds(_ seconds: Double) -> UInt64 {
    guard seconds > 0 else { return 0 }  // also NaN
    return UInt64(min(seconds, maximumSeconds) * 1e9)
}

/// Where a request is in its life. One phase at a time, changed only by `RequestRecord.move(to:because:)`:
///
///     begun ──▶ queued ──▶ running ──▶ ended
///       │         ▲           │          ▲
///       │         ╰─requeued──╯          │   (its worker died before its handshake: at most twice)
///       ╰──────────────▶ running         │
///     any of begun, queued, running ─────╯   (its one outcome)
enum RequestPhase: String, Equatable, CustomStringConvertible {
    /// Accepted by the engine; not yet queued or sent.
    case begun
    /// Waiting in its pool's queue for a worker with room.
    case queued
    /// Sent to a worker (`RequestRecord.worker`), which has not answered it.
    case running
    /// Its one outcome is delivered (or on its way): nothing more happens to it.
    case ended

    var description: String { rawValue }

    /// Whether `from` may become `to`.
    static func allows(_ from: RequestPhase, _ to: RequestPhase) -> Bool {
        switch (from, to) {
        case (.begun, .queued), (.begun, .running), (.queued, .running), (.running, .queued): return true
        case (.begun, .ended), (.queued, .ended), (.running, .ended): return true
        default: return false
        }
    }
}

/// One request. Loop-confined.
final class RequestRecord {
    // Stored properties `@exclusivity(unchecked)` (see RequestTable), but what holds the caller's closures or
    // objects (`deliver`, `progress`, `deliverForwarded`, `services`, `hostCalls`, `onWorkerAssigned`) keeps its
    // checks: dropping one runs the caller's deinits inside the write. `items` holds the caller's files too, but
    // their deinit only closes a descriptor.
    /// Its phase, and the changes that led there with their causes (the last `historyLimit`).
    @exclusivity(unchecked) private(set) var phase = RequestPhase.begun
    @exclusivity(unchecked) private(set) var history: [(to: RequestPhase, cause: StaticString)] = []
    static let historyLimit = 6

    /// The one place a request's phase changes. An illegal change (a begin after its end, a second end) traps
    /// in debug builds and changes nothing otherwise. Causes are static text: this runs twice per request.
    @discardableResult
    func move(to next: RequestPhase, because cause: StaticString) -> Bool {
        guard RequestPhase.allows(phase, next) else {
            assertionFailure("request \(id): \(phase) → \(next) is not allowed (\(cause))")
            return false
        }
        // Room for the whole history at the first change: growing it one append at a time was two more
        // allocations per request.
        if history.isEmpty { history.reserveCapacity(Self.historyLimit) }
        if history.count == Self.historyLimit { history.removeFirst() }
        history.append((next, cause))
        phase = next
        return true
    }

    let id: RequestID
    let extensionID: String
    /// Dropped when the request is sent to a worker or ends: the host keeps no copy.
    @exclusivity(unchecked) var items: [ExtensionItem]
    /// Cleared when the outcome is delivered, so nothing of the caller is retained afterwards.
    var deliver: (@Sendable (RequestOutcome) -> Void)?
    /// Takes partial results; cleared with `deliver`.
    var progress: (@Sendable ([ExtensionItem]) -> Void)?
    /// The daemon's forwarding (SubmittedRequest); dropped with `items` and `deliver`.
    @exclusivity(unchecked) var forwardedBegin: ForwardedFrame?
    var deliverForwarded: (@Sendable (RequestOutcome, UnsafeRawBufferPointer, Range<Int>) -> Void)?
    /// Answers its worker's host calls; dropped with `deliver`.
    var services: (any HostServiceProvider)?
    /// Its host calls running in the app, by the worker's call number: what cancels each. Emptied (each
    /// cancelled) when it ends.
    var hostCalls: [Int64: @Sendable () -> Void] = [:]
    /// `SubmittedRequest.publishesPid`.
    @exclusivity(unchecked) var publishesPid = true
    let deadline: Double?
    /// The pool that serves it (the extension, or the extension for one daemon client app).
    @exclusivity(unchecked) var poolKey: String = ""
    @exclusivity(unchecked) var app: String?
    /// When it began (loop clock), for latency and hang reports.
    @exclusivity(unchecked) var startedAt: UInt64 = 0
    /// Its extension's counters (set when it starts).
    @exclusivity(unchecked) var tally: ExtensionTally?
    /// Its extension's `SlowRequestThresholdMilliseconds`, in nanoseconds.
    @exclusivity(unchecked) var slowRequestThreshold: UInt64 = .max
    /// Times it went back to the queue because its worker died before its handshake.
    @exclusivity(unchecked) var requeues = 0
    @exclusivity(unchecked) var worker: WorkerProcess?
    @exclusivity(unchecked) var deadlineTimer: TimerID?
    /// Told the worker's pid when the request is sent to one (demo and tools; called on the loop thread).
    var onWorkerAssigned: (@Sendable (pid_t) -> Void)?
    /// Links in the extension's wait queue.
    @exclusivity(unchecked) fileprivate var queueNext: RequestRecord?
    @exclusivity(unchecked) fileprivate unowned(unsafe) var queuePrev: RequestRecord?
    @exclusivity(unchecked) fileprivate(set) var isQueued = false

    init(id: RequestID, extensionID: String, items: [ExtensionItem], deadline: Double?,
         deliver: @escaping @Sendable (RequestOutcome) -> Void)
    {
        self.id = id
        self.extensionID = extensionID
        self.items = items
        self.deadline = deadline
        self.deliver = deliver
    }
}

/// Requests waiting for a worker, oldest first. Loop-confined.
final class RequestQueue {
    // Stored properties `@exclusivity(unchecked)`: see RequestTable.
    @exclusivity(unchecked) private(set) var count = 0
    @exclusivity(unchecked) private var head: RequestRecord?
    @exclusivity(unchecked) private unowned(unsafe) var tail: RequestRecord?

    var isEmpty: Bool { count == 0 }
    var first: RequestRecord? { head }

    func append(_ record: RequestRecord) {
        precondition(!record.isQueued, "request \(record.id) queued twice")
        record.move(to: .queued, because: "no worker with room")
        record.isQueued = true
        record.queuePrev = tail
        record.queueNext = nil
        if let tail { tail.queueNext = record } else { head = record }
        tail = record
        count += 1
    }

    /// Puts `record` first (a request whose worker died before running it keeps its place).
    func prepend(_ record: RequestRecord) {
        precondition(!record.isQueued, "request \(record.id) queued twice")
        record.move(to: .queued, because: "its worker died before its handshake")
        record.isQueued = true
        record.queuePrev = nil
        record.queueNext = head
        if let head { head.queuePrev = record } else { tail = record }
        head = record
        count += 1
    }

    func popFirst() -> RequestRecord? {
        guard let first = head else { return nil }
        remove(first)
        return first
    }

    func remove(_ record: RequestRecord) {
        guard record.isQueued else { return }
        let next = record.queueNext
        let prev = record.queuePrev
        if let prev { prev.queueNext = next } else { head = next }
        if let next { next.queuePrev = prev } else { tail = prev }
        record.queueNext = nil
        record.queuePrev = nil
        record.isQueued = false
        count -= 1
    }

    /// Empties the queue, oldest first. Unlinks one by one: releasing a long chain at once would recurse.
    func removeAll() -> [RequestRecord] {
        var out: [RequestRecord] = []
        out.reserveCapacity(count)
        while let record = popFirst() { out.append(record) }
        return out
    }

    deinit { _ = removeAll() }
}
