// The event loop under hostile load: cancelled timers leave nothing behind, a flood of tasks cannot starve
// descriptors, a stop never drops a task it accepted, and a manual clock drives timers deterministically.
import SDKPosix
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Runs `body` on the loop and waits for its result.
func onLoop<T: Sendable>(_ loop: EventLoop, _ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        let accepted = loop.execute { continuation.resume(returning: body()) }
        precondition(accepted, "loop stopped")
    }
}

func stopAndWait(_ loop: EventLoop) async {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        loop.stop { continuation.resume() }
    }
}

@Suite struct EventLoopHardeningTests {
    @Test func cancelledTimersAreRemovedAtOnce() async throws {
        let loop = try EventLoop(name: "test-timers")
        let pending = await onLoop(loop) { () -> Int in
            // 10,000 long deadlines, all cancelled: none may linger until its deadline.
            let ids = (0..<10_000).map { i in loop.schedule(afterNanoseconds: 3_600_000_000_000 + UInt64(i)) {} }
            for id in ids.shuffled() { loop.cancelTimer(id) }
            return loop.pendingTimerCount
        }
        #expect(pending == 0)
        // Cancelling in the middle keeps the heap ordered.
        let order = Mutex<[Int]>([])
        let clock = ManualClock()
        let manual = try EventLoop(name: "test-manual", clock: clock)
        await onLoop(manual) {
            var ids: [TimerID] = []
            for i in (0..<50).reversed() {
                ids.append(manual.schedule(afterNanoseconds: UInt64(i) * 1000) { order.withLock { $0.append(i) } })
            }
            for (n, id) in ids.enumerated() where n % 3 == 0 { manual.cancelTimer(id) }
        }
        clock.advance(by: 1_000_000)
        manual.wake()
        // A task can run in the turn that is already past its timer phase (it read the clock before the
        // advance); the turn after it fires every due timer. A second hop lands after that turn.
        await onLoop(manual) {}
        await onLoop(manual) {}
        let fired = order.withLock { $0 }
        let expected = (0..<50).filter { (49 - $0) % 3 != 0 }
        #expect(fired == expected)
        await stopAndWait(loop)
        await stopAndWait(manual)
    }

    /// A timer's id stays meaningless once the timer has fired or been cancelled, even after its slot in the heap
    /// has been reused; and random schedules and cancels fire exactly the live timers, in deadline order.
    @Test func staleTimerIDsCancelNothingAndRandomSchedulesFireInOrder() async throws {
        let clock = ManualClock()
        let loop = try EventLoop(name: "test-stale", clock: clock)
        let fired = Mutex<[Int]>([])
        let stale = await onLoop(loop) { () -> [TimerID] in
            let first = loop.schedule(afterNanoseconds: 10) { fired.withLock { $0.append(-1) } }
            loop.cancelTimer(first)
            // Reuses the cancelled timer's slot; cancelling with the old id must leave it alone.
            _ = loop.schedule(afterNanoseconds: 20) { fired.withLock { $0.append(-2) } }
            loop.cancelTimer(first)
            return [first]
        }
        clock.advance(by: 100)
        loop.wake()
        await onLoop(loop) {}
        await onLoop(loop) {}
        #expect(fired.withLock { $0 } == [-2])
        // The fired timer's id as well, once its slot holds another timer.
        let (expected, deadlines) = await onLoop(loop) { () -> ([Int], [Int: UInt64]) in
            fired.withLock { $0 = [] }
            _ = loop.schedule(afterNanoseconds: 5) { fired.withLock { $0.append(-3) } }
            for id in stale { loop.cancelTimer(id) }
            // Then a random mix: each timer fires at most once, cancelled ones never, in deadline order.
            var g = SystemRandomNumberGenerator()
            var live: [(deadline: UInt64, n: Int, id: TimerID)] = []
            for n in 0..<2_000 {
                if !live.isEmpty, Int.random(in: 0..<3, using: &g) == 0 {
                    let victim = live.remove(at: Int.random(in: 0..<live.count, using: &g))
                    loop.cancelTimer(victim.id)
                    loop.cancelTimer(victim.id)  // twice: the second finds nothing, or someone else's slot
                } else {
                    let deadline = UInt64.random(in: 10...1_000_000, using: &g)
                    live.append((deadline, n, loop.schedule(afterNanoseconds: deadline) { fired.withLock { $0.append(n) } }))
                }
            }
            var deadlines: [Int: UInt64] = [-3: 5]
            for timer in live { deadlines[timer.n] = timer.deadline }
            return ([-3] + live.map(\.n), deadlines)
        }
        clock.advance(by: 2_000_000)
        loop.wake()
        await onLoop(loop) {}
        await onLoop(loop) {}
        await onLoop(loop) {}
        let got = fired.withLock { $0 }
        #expect(got.count == expected.count && Set(got) == Set(expected), "each live timer fires once, no cancelled one")
        let firedDeadlines = got.map { deadlines[$0] ?? 0 }
        #expect(zip(firedDeadlines, firedDeadlines.dropFirst()).allSatisfy { $0 <= $1 }, "in deadline order")
        #expect(await onLoop(loop) { loop.pendingTimerCount } == 0)
        await stopAndWait(loop)
    }

    /// A loop that cannot make its epoll, eventfd or timerfd descriptor throws, and leaves open none of those it
    /// did make. In a child process, since it lowers the descriptor limit.
    @Test func aLoopWithoutItsDescriptorsClosesWhatItMade() async {
        await #expect(processExitsWith: .success) {
            var limit = rlimit()
            getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
            // With room for `spare` more descriptors: the loop made, and whether the descriptors are as before.
            func attempt(spare: Int) -> (EventLoop?, unchanged: Bool) {
                var used = Set(links(of: getpid()).keys)
                // The listing's own descriptor had the lowest free number; it is free again.
                let probe = open("/dev/null", O_RDONLY | O_CLOEXEC)
                close(probe)
                used.remove(Int(probe))
                // A limit just above the `spare` lowest free numbers: exactly that many more can be opened.
                var ceiling = 0, skipped = 0
                while used.contains(ceiling) || skipped < spare {
                    if !used.contains(ceiling) { skipped += 1 }
                    ceiling += 1
                }
                let before = openDescriptors()
                var lowered = limit
                lowered.rlim_cur = rlim_t(ceiling)
                setrlimit(Int32(RLIMIT_NOFILE.rawValue), &lowered)
                let loop = try? EventLoop(name: "test-limit")
                setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
                return (loop, openDescriptors() == before)
            }
            // The test runner's own threads open descriptors now and then (a dispatch timer's timerfd, seen once
            // in 30 runs), and may take the room given to the loop or change the listing, so each case has five
            // attempts. A descriptor the loop leaks shows in every one.
            for spare in 0...3 {
                var shown = false
                for _ in 0..<5 where !shown {
                    let (loop, unchanged) = attempt(spare: spare)
                    if let loop { await stopAndWait(loop) }
                    shown = spare < 3 ? loop == nil && unchanged : loop != nil
                }
                guard shown else { exit(Int32(1 + spare)) }
            }
        }
    }

    @Test func manualClockTimersFireOnlyWhenTimeMoves() async throws {
        let clock = ManualClock()
        let loop = try EventLoop(name: "test-clock")
        _ = loop
        let manual = try EventLoop(name: "test-clock2", clock: clock)
        let fired = Atomic(0)
        await onLoop(manual) { _ = manual.schedule(afterNanoseconds: 5_000_000_000) { fired.add(1, ordering: .relaxed) } }
        try await Task.sleep(nanoseconds: 50_000_000)
        let early = fired.load(ordering: .relaxed)
        #expect(early == 0, "no real time passes on a manual clock")
        clock.advance(by: 4_999_999_999)
        manual.wake()
        await onLoop(manual) {}
        let before = fired.load(ordering: .relaxed)
        #expect(before == 0)
        clock.advance(by: 1)
        manual.wake()
        await onLoop(manual) {}
        await onLoop(manual) {}  // the turn after the first hop's fires what is due (see above)
        let after = fired.load(ordering: .relaxed)
        #expect(after == 1)
        await stopAndWait(manual)
        await stopAndWait(loop)
    }

    @Test func aTaskFloodDoesNotStarveDescriptors() async throws {
        let loop = try EventLoop(name: "test-flood")
        var fds: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0, &fds) == 0)
        let (a, b) = (fds[0], fds[1])
        let readSeen = Atomic(false)
        let flooding = Atomic(true)
        // A task that re-queues itself forever: the first slice's loop ran tasks until none were left, so a
        // readable descriptor was never looked at.
        @Sendable func flood() {
            if flooding.load(ordering: .relaxed) { loop.execute { flood() } }
        }
        await onLoop(loop) {
            try! loop.register(a, events: EventLoop.readable) { _ in
                var byte: UInt8 = 0
                _ = read(a, &byte, 1)
                readSeen.store(true, ordering: .relaxed)
            }
            for _ in 0..<4 { flood() }
        }
        var one: UInt8 = 1
        #expect(write(b, &one, 1) == 1)
        let deadline = monotonicNanoseconds() + 30_000_000_000
        while !readSeen.load(ordering: .relaxed), monotonicNanoseconds() < deadline {
            try await Task.sleep(nanoseconds: 1_000_000)
        }
        flooding.store(false, ordering: .relaxed)
        let seen = readSeen.load(ordering: .relaxed)
        #expect(seen)
        await onLoop(loop) { loop.unregister(a) }
        await stopAndWait(loop)
        close(a)
        close(b)
    }

    @Test func stopNeverDropsAnAcceptedTask() async throws {
        // Each round: threads hand tasks in while the loop stops. Every task `execute` accepted must run;
        // the first slice dropped the ones accepted between its last batch and the stop (about half the races).
        final class Counts: Sendable {
            let accepted = Atomic(0)
            let ran = Atomic(0)
            let started = Atomic(0)
        }
        for _ in 0..<200 {
            let loop = try EventLoop(name: "test-stop")
            let counts = Counts()
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<3 {
                    group.addTask {
                        counts.started.add(1, ordering: .relaxed)
                        for _ in 0..<50 {
                            if loop.execute({ counts.ran.add(1, ordering: .relaxed) }) {
                                counts.accepted.add(1, ordering: .relaxed)
                            }
                        }
                    }
                }
                group.addTask {
                    while counts.started.load(ordering: .relaxed) == 0 { await Task.yield() }
                    await stopAndWait(loop)
                }
            }
            let (r, a) = (counts.ran.load(ordering: .relaxed), counts.accepted.load(ordering: .relaxed))
            #expect(r == a)
        }
    }

    @Test func aWakeAfterTheStopWritesToNoReusedDescriptor() async throws {
        // `execute` writes its wake-up after leaving the inbox's lock, so a stop can complete in between. The
        // loop used to close its eventfd at the stop: the next descriptor the process opened took its number and
        // received the 8 bytes. Each round opens pipes at once after the stop (the lowest free numbers, so one of
        // them the eventfd's if it was closed), wakes the stopped loop, and checks that nothing arrived.
        for _ in 0..<20 {
            var loop: EventLoop? = try EventLoop(name: "test-wake-after-stop")
            await stopAndWait(loop!)
            var pipes: [[Int32]] = []
            for _ in 0..<3 {
                var fds: [Int32] = [-1, -1]
                #expect(pipe(&fds) == 0)
                _ = fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK)
                pipes.append(fds)
            }
            loop!.wake()
            #expect(loop!.execute {} == false)
            for fds in pipes {
                var byte: UInt8 = 0
                #expect(read(fds[0], &byte, 1) == -1 && errno == EAGAIN, "a stopped loop wrote to descriptor \(fds[1])")
                close(fds[0])
                close(fds[1])
            }
            loop = nil
        }
    }
}
