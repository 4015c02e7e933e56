// CallbackBatcher: hands an Extension's handler calls to its callback queue in batches. Every call a loop turn
// delivers goes over in one queue hop, and calls that arrive while the queue is still running the last batch
// join it without a hop of their own. Each hop to an idle queue wakes a thread; at 64 requests in flight, one
// hop per call woke the callback thread twice per loop turn on average.

#if canImport(Glibc)
import Dispatch
import Synchronization
#endif

final class CallbackBatcher: Sendable {
    private struct State {
        /// Calls not yet taken by the queue, in the order they were added.
        var calls: [@Sendable () -> Void] = []
        /// A drain is queued or running: it takes what is added until it finds nothing left.
        var draining = false
        /// A hand-over is due at the end of the current loop turn.
        var handOverDue = false
    }

    /// Calls run per queue hop before the drain queues itself again, so other work on the queue gets its turn.
    static let callsPerHop = 256

    /// The serial queue the calls run on, one at a time, in order.
    let queue: DispatchQueue
    private let state = Mutex(State())

    init(queue: DispatchQueue) {
        self.queue = queue
    }

    /// Adds `call`, on `backend`'s loop thread or anywhere else. The calls gathered by the end of the loop's turn
    /// (`TurnEnding.atEndOfTurn`) go to the queue together.
    func add(_ call: @escaping @Sendable () -> Void, from backend: some TurnEnding) {
        let scheduleHandOver = state.withLock { s -> Bool in
            s.calls.append(call)
            guard !s.draining, !s.handOverDue else { return false }
            s.handOverDue = true
            return true
        }
        if scheduleHandOver { backend.atEndOfTurn { [self] in handOver() } }
    }

    private func handOver() {
        let start = state.withLock { s -> Bool in
            s.handOverDue = false
            guard !s.draining, !s.calls.isEmpty else { return false }
            s.draining = true
            return true
        }
        if start { queue.async { [self] in drain() } }
    }

    /// On the queue: runs calls until none is left, or queues itself again after `callsPerHop`.
    private func drain() {
        var batch: [@Sendable () -> Void] = []
        var ran = 0
        while true {
            let more = state.withLock { s -> Bool in
                if s.calls.isEmpty {
                    s.draining = false
                    return false
                }
                swap(&batch, &s.calls)
                return true
            }
            guard more else { return }
            for index in batch.indices {
                batch[index]()
                ran += 1
                if ran == Self.callsPerHop {
                    // What is left goes back ahead of newer calls, and the drain behind what else is queued.
                    if index + 1 < batch.count {
                        let rest = batch[(index + 1)...]
                        state.withLock { $0.calls.insert(contentsOf: rest, at: 0) }
                    }
                    queue.async { [self] in drain() }
                    return
                }
            }
            batch.removeAll(keepingCapacity: true)
        }
    }
}
