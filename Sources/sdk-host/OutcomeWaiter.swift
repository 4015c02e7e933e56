// OutcomeWaiter: records every terminal callback of one Extension and lets a CLI command's thread wait for a
// request's outcome. Commands may block their own thread; the library never blocks its caller.
import Dispatch
import SDKHost
import Synchronization

final class OutcomeWaiter: Sendable {
    private let outcomes = Mutex<[RequestID: [RequestOutcome]]>([:])
    private let arrived = DispatchSemaphore(value: 0)

    /// Installs the three handlers on `ext`.
    init(attachingTo ext: Extension) {
        ext.requestCompletionHandler = { id, items in self.record(id, .completed(items)) }
        ext.requestCancellationHandler = { id, error in self.record(id, .cancelled(error)) }
        ext.requestInterruptionHandler = { id, reason in self.record(id, .interrupted(reason)) }
    }

    private func record(_ id: RequestID, _ outcome: RequestOutcome) {
        outcomes.withLock { $0[id, default: []].append(outcome) }
        arrived.signal()
    }

    /// The first outcome of `id`, waiting up to `timeout` seconds for it; nil if none came.
    func wait(for id: RequestID, timeout: Double = .infinity) -> RequestOutcome? {
        let deadline: DispatchTime = timeout.isFinite ? .now() + timeout : .distantFuture
        while true {
            if let first = outcomes.withLock({ $0[id]?.first }) { return first }
            if arrived.wait(timeout: deadline) == .timedOut { return outcomes.withLock { $0[id]?.first } }
        }
    }

    /// How many terminal callbacks `id` got (exactly one, if the host keeps its guarantee).
    func callbackCount(_ id: RequestID) -> Int { outcomes.withLock { $0[id]?.count ?? 0 } }

    /// Ids that got any callback.
    var idsWithCallbacks: Set<RequestID> { outcomes.withLock { Set($0.keys) } }
}
