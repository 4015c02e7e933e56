// CallbackBatcher: a loop turn's first call goes to the callback queue at once and the rest of the turn's calls
// together when it ends, in order, each once; calls added while the queue runs a batch join it; a long batch lets
// other work on the queue in after every `callsPerHop` calls. A hand-made turn stands in for the event loop, so each step is the test's to take.
import Dispatch
@testable import SDKHost
import Synchronization
import Testing

/// A loop turn the test ends by hand: `atEndOfTurn` bodies wait for `endTurn()`, unless `offLoop`.
private final class HandTurn: TurnEnding {
    private let hooks = Mutex<[@Sendable () -> Void]>([])
    let offLoop: Bool
    let requested = Atomic<Int>(0)
    init(offLoop: Bool = false) { self.offLoop = offLoop }

    func atEndOfTurn(_ body: @escaping @Sendable () -> Void) {
        requested.add(1, ordering: .relaxed)
        if offLoop { return body() }
        hooks.withLock { $0.append(body) }
    }

    func endTurn() {
        for hook in hooks.withLock({ h in defer { h = [] }; return h }) { hook() }
    }
}

@Suite struct CallbackBatcherTests {
    @Test func theTurnsFirstCallGoesAtOnceAndTheRestAtTheTurnsEnd() {
        let queue = DispatchQueue(label: "batcher-test")
        let batcher = CallbackBatcher(queue: queue)
        let turn = HandTurn()
        let seen = Mutex<[Int]>([])
        batcher.add({ seen.withLock { $0.append(0) } }, from: turn)
        queue.sync {}
        #expect(seen.withLock { $0 } == [0], "the first call of a turn does not wait for its end")
        for i in 1..<100 { batcher.add({ seen.withLock { $0.append(i) } }, from: turn) }
        queue.sync {}
        #expect(seen.withLock { $0 } == [0], "the queue went idle: the turn's later calls wait for its end")
        #expect(turn.requested.load(ordering: .relaxed) == 1, "one end-of-turn hand-over, not one per call")
        turn.endTurn()
        queue.sync {}
        #expect(seen.withLock { $0 } == Array(0..<100))
        turn.endTurn()  // nothing left: nothing runs twice
        queue.sync {}
        #expect(seen.withLock { $0.count } == 100)
        batcher.add({ seen.withLock { $0.append(100) } }, from: turn)  // a new turn: at once again
        queue.sync {}
        #expect(seen.withLock { $0 } == Array(0...100))
        #expect(turn.requested.load(ordering: .relaxed) == 2)
    }

    @Test func callsAddedWhileTheQueueRunsABatchJoinIt() {
        let queue = DispatchQueue(label: "batcher-test")
        let batcher = CallbackBatcher(queue: queue)
        let turn = HandTurn()
        let running = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let seen = Mutex<[Int]>([])
        batcher.add({
            running.signal()
            release.wait()
            seen.withLock { $0.append(0) }
        }, from: turn)
        running.wait()
        for i in 1...3 { batcher.add({ seen.withLock { $0.append(i) } }, from: turn) }
        #expect(turn.requested.load(ordering: .relaxed) == 1, "the running batch takes them: no new hand-over")
        release.signal()
        queue.sync {}
        #expect(seen.withLock { $0 } == [0, 1, 2, 3], "they ran without the turn ending")
    }

    @Test func aLongBatchLetsOtherWorkOnTheQueueIn() {
        let queue = DispatchQueue(label: "batcher-test")
        let batcher = CallbackBatcher(queue: queue)
        let turn = HandTurn()
        let total = CallbackBatcher.callsPerHop * 3
        let count = Atomic<Int>(0)
        let queuedOther = DispatchSemaphore(value: 0)
        batcher.add({
            queuedOther.wait()
            count.add(1, ordering: .relaxed)
        }, from: turn)
        for _ in 1..<total { batcher.add({ count.add(1, ordering: .relaxed) }, from: turn) }
        let seenByOther = Atomic<Int>(-1)
        queue.async { seenByOther.store(count.load(ordering: .relaxed), ordering: .relaxed) }
        queuedOther.signal()
        // Each drain queues the next behind whatever is queued by then, so one `sync` may return between hops.
        for _ in 0..<10 where count.load(ordering: .relaxed) < total { queue.sync {} }
        #expect(seenByOther.load(ordering: .relaxed) == CallbackBatcher.callsPerHop)
        #expect(count.load(ordering: .relaxed) == total)
    }

    @Test func offTheLoopACallGoesOverAtOnce() {
        let queue = DispatchQueue(label: "batcher-test")
        let batcher = CallbackBatcher(queue: queue)
        let turn = HandTurn(offLoop: true)
        let ran = Atomic<Int>(0)
        batcher.add({ ran.add(1, ordering: .relaxed) }, from: turn)
        queue.sync {}
        #expect(ran.load(ordering: .relaxed) == 1)
    }
}
