// CallbackBatcher: the calls of one loop turn go to the callback queue in one hop, in order, each once; calls
// added while the queue runs a batch join it; a long batch lets other work on the queue in after every
// `callsPerHop` calls. A hand-made turn stands in for the event loop, so each step is the test's to take.
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
    @Test func aTurnsCallsGoOverTogetherInOrderOnce() {
        let queue = DispatchQueue(label: "batcher-test")
        let batcher = CallbackBatcher(queue: queue)
        let turn = HandTurn()
        let seen = Mutex<[Int]>([])
        for i in 0..<100 { batcher.add({ seen.withLock { $0.append(i) } }, from: turn) }
        queue.sync {}
        #expect(seen.withLock { $0 }.isEmpty, "nothing runs before the turn ends")
        #expect(turn.requested.load(ordering: .relaxed) == 1, "one hand-over per turn, not one per call")
        turn.endTurn()
        queue.sync {}
        #expect(seen.withLock { $0 } == Array(0..<100))
        turn.endTurn()  // nothing left: no second run
        queue.sync {}
        #expect(seen.withLock { $0.count } == 100)
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
        turn.endTurn()
        running.wait()
        for i in 1...3 { batcher.add({ seen.withLock { $0.append(i) } }, from: turn) }
        #expect(turn.requested.load(ordering: .relaxed) == 1, "the running batch takes them: no new hand-over")
        release.signal()
        queue.sync {}
        #expect(seen.withLock { $0 } == [0, 1, 2, 3])
        // The queue went idle: the next call needs a hand-over again.
        batcher.add({ seen.withLock { $0.append(4) } }, from: turn)
        #expect(turn.requested.load(ordering: .relaxed) == 2)
        turn.endTurn()
        queue.sync {}
        #expect(seen.withLock { $0 } == [0, 1, 2, 3, 4])
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
        turn.endTurn()
        let seenByOther = Atomic<Int>(-1)
        queue.async { seenByOther.store(count.load(ordering: .relaxed), ordering: .relaxed) }
        queuedOther.signal()
        queue.sync {}
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
