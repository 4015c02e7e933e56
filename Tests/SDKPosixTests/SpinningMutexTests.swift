// SpinningMutex: mutual exclusion under contention from several threads, and a waiter whose holder keeps the
// lock past the spin (so it sleeps on the futex) is woken when the holder lets go.
import Dispatch
import SDKPosix
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct SpinningMutexTests {
    @Test func fourThreadsIncrementingLoseNoUpdate() {
        let counter = SpinningMutex(0)
        let group = DispatchGroup()
        for _ in 0..<4 {
            DispatchQueue.global().async(group: group) {
                for _ in 0..<50_000 { counter.withLock { $0 += 1 } }
            }
        }
        group.wait()
        #expect(counter.withLock { $0 } == 200_000)
    }

    @Test func aWaiterPastTheSpinSleepsAndIsWokenOnRelease() {
        let state = SpinningMutex<[Int]>([])
        let held = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            state.withLock { list in
                held.signal()
                usleep(50_000)  // far past the spin: the waiter sleeps on the futex
                list.append(1)
            }
        }
        held.wait()
        #expect(state.withLockIfAvailable { _ in true } == nil, "taken while held")
        DispatchQueue.global().async {
            state.withLock { $0.append(2) }
            done.signal()
        }
        #expect(done.wait(timeout: .now() + 30) == .success, "the sleeping waiter was never woken")
        #expect(state.withLock { $0 } == [1, 2])
    }
}
