// `EventLoop.executeInline`: a task runs on its caller's thread only when the loop is asleep with nothing queued,
// holds the loop's state alone while it runs, keeps the order of everything handed to the loop, and wakes the
// loop for a timer earlier than the one it sleeps on.
import Dispatch
import SDKPosix
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct EventLoopInlineTests {
    @Test func runsOnTheCallersThreadWhenTheLoopSleeps() async throws {
        let loop = try EventLoop(name: "test-inline")
        await onLoop(loop) {}  // the loop is up and asleep
        usleep(20_000)
        let caller = UInt(pthread_self())
        let seen = Mutex<(thread: UInt, inLoop: Bool, inline: Bool)?>(nil)
        let accepted = loop.executeInline {
            seen.withLock { $0 = (UInt(pthread_self()), loop.inLoop, loop.runningInline) }
        }
        #expect(accepted)
        let ran = try #require(seen.withLock { $0 })
        #expect(ran.thread == caller)
        #expect(ran.inLoop && ran.inline)
        // Outside the task this thread does not hold the loop, and a task on the loop thread is not inline.
        #expect(!loop.inLoop)
        let onLoopThread = await onLoop(loop) { (UInt(pthread_self()), loop.runningInline) }
        #expect(onLoopThread.0 != caller && !onLoopThread.1)
        await stopAndWait(loop)
    }

    @Test func aTaskNotAllowedInlineRunsOnTheLoopThread() async throws {
        let loop = try EventLoop(name: "test-inline-when")
        await onLoop(loop) {}
        usleep(20_000)
        let caller = UInt(pthread_self())
        let askedHoldingTheTurn = Mutex<Bool?>(nil)
        let ran = DispatchSemaphore(value: 0)
        let thread = Mutex<UInt>(0)
        #expect(loop.executeInline(when: {
            askedHoldingTheTurn.withLock { $0 = loop.inLoop }
            return false
        }) {
            thread.withLock { $0 = UInt(pthread_self()) }
            ran.signal()
        })
        #expect(ran.wait(timeout: .now() + 10) == .success)
        #expect(askedHoldingTheTurn.withLock { $0 } == true)
        #expect(thread.withLock { $0 } != caller)
        await stopAndWait(loop)
    }

    @Test func aBusyLoopQueuesTheTaskBehindEarlierOnes() async throws {
        let loop = try EventLoop(name: "test-inline-order")
        let release = DispatchSemaphore(value: 0)
        let started = DispatchSemaphore(value: 0)
        let order = Mutex<[String]>([])
        loop.execute {
            started.signal()
            release.wait()  // holds the loop's turn
            order.withLock { $0.append("blocker") }
        }
        started.wait()
        loop.execute { order.withLock { $0.append("queued") } }
        let caller = UInt(pthread_self())
        let thread = Mutex<UInt>(0)
        #expect(loop.executeInline {
            order.withLock { $0.append("inline") }
            thread.withLock { $0 = UInt(pthread_self()) }
        })
        // Not run yet: the loop was busy, so the task waits its turn behind the queued one.
        #expect(order.withLock { $0 } == [])
        release.signal()
        await onLoop(loop) {}
        #expect(order.withLock { $0 } == ["blocker", "queued", "inline"])
        #expect(thread.withLock { $0 } != caller)
        await stopAndWait(loop)
    }

    @Test func queuedWorkKeepsItsPlaceEvenWhenTheTurnIsFree() async throws {
        // Many threads alternate execute and executeInline; each thread's own tasks must run in its order.
        let loop = try EventLoop(name: "test-inline-mix")
        final class Seen: Sendable { let order = Mutex<[Int: [Int]]>([:]) }
        let seen = Seen()
        DispatchQueue.concurrentPerform(iterations: 4) { t in
            for i in 0..<2000 {
                let task: @Sendable () -> Void = { seen.order.withLock { $0[t, default: []].append(i) } }
                if i % 3 == 0 { loop.execute(task) } else { loop.executeInline(task) }
            }
        }
        await onLoop(loop) {}
        let all = seen.order.withLock { $0 }
        for t in 0..<4 { #expect(all[t] == Array(0..<2000), "thread \(t) saw its tasks out of order") }
        await stopAndWait(loop)
    }

    @Test func aTimerSetInlineWakesTheSleepingLoop() async throws {
        let loop = try EventLoop(name: "test-inline-timer")
        await onLoop(loop) {}
        usleep(20_000)  // asleep with no timer at all: it would sleep forever
        let fired = DispatchSemaphore(value: 0)
        let timerThread = Mutex<UInt>(0)
        let caller = UInt(pthread_self())
        loop.executeInline {
            loop.schedule(afterNanoseconds: 5_000_000) {
                timerThread.withLock { $0 = UInt(pthread_self()) }
                fired.signal()
            }
        }
        #expect(fired.wait(timeout: .now() + 10) == .success)
        #expect(timerThread.withLock { $0 } != caller)  // timers fire on the loop thread
        await stopAndWait(loop)
    }

    @Test func anEarlierTimerSetInlineFiresBeforeTheOneTheLoopSleepsOn() async throws {
        let loop = try EventLoop(name: "test-inline-earlier")
        let fired = DispatchSemaphore(value: 0)
        let late = Mutex<Bool>(false)
        await onLoop(loop) { _ = loop.schedule(afterNanoseconds: 600_000_000_000) { late.withLock { $0 = true } } }
        usleep(20_000)  // asleep until the ten-minute timer
        loop.executeInline { _ = loop.schedule(afterNanoseconds: 5_000_000) { fired.signal() } }
        #expect(fired.wait(timeout: .now() + 10) == .success)
        #expect(!late.withLock { $0 })
        await stopAndWait(loop)
    }

    @Test func aCancelledTimerLeavesLaterTimersFiring() async throws {
        // The timerfd stays armed for a cancelled timer's deadline; expiring early must re-arm for the next one.
        let loop = try EventLoop(name: "test-inline-stale")
        let fired = DispatchSemaphore(value: 0)
        let cancelledRan = Mutex<Bool>(false)
        loop.executeInline {
            let early = loop.schedule(afterNanoseconds: 10_000_000) { cancelledRan.withLock { $0 = true } }
            loop.cancelTimer(early)
            _ = loop.schedule(afterNanoseconds: 60_000_000) { fired.signal() }
        }
        #expect(fired.wait(timeout: .now() + 10) == .success)
        #expect(!cancelledRan.withLock { $0 })
        // And a timer set from the loop thread itself after that.
        await onLoop(loop) { _ = loop.schedule(afterNanoseconds: 5_000_000) { fired.signal() } }
        #expect(fired.wait(timeout: .now() + 10) == .success)
        await stopAndWait(loop)
    }

    @Test func aStoppedLoopRefusesInlineWork() async throws {
        let loop = try EventLoop(name: "test-inline-stop")
        await stopAndWait(loop)
        let ran = Mutex<Bool>(false)
        #expect(!loop.executeInline { ran.withLock { $0 = true } })
        #expect(!ran.withLock { $0 })
    }
}
