// Busy polling (EventLoop.swift): a loop that has just handled something polls for its budget before it sleeps,
// so a message that comes within the budget is taken awake; an idle loop polls once and then sleeps.
import HostTestSupport
import SDKPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct BusyPollTests {
    /// Ping-pongs `rounds` one-byte messages with a handler on `loop` that echoes them.
    func pingPong(_ loop: EventLoop, rounds: Int) async throws {
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0)
        let (mine, theirs) = (pair[0], pair[1])
        defer { _ = close(mine); _ = close(theirs) }
        let registered = await onLoop(loop) { () -> Bool in
            (try? loop.register(theirs, events: EventLoop.readable) { _ in
                var byte: UInt8 = 0
                while recv(theirs, &byte, 1, Int32(MSG_DONTWAIT)) == 1 { _ = send(theirs, &byte, 1, Int32(MSG_DONTWAIT)) }
            }) != nil
        }
        #expect(registered)
        for i in 0..<rounds {
            var byte = UInt8(truncatingIfNeeded: i)
            #expect(send(mine, &byte, 1, 0) == 1)
            var back: UInt8 = 0
            #expect(recv(mine, &back, 1, 0) == 1 && back == byte)
        }
        await onLoop(loop) { loop.unregister(theirs) }
    }

    /// CPU time of one thread of this process, from /proc (nanoseconds run).
    func cpuNanoseconds(thread tid: String) -> UInt64? {
        readSmallFile("/proc/self/task/\(tid)/schedstat")?.split(separator: " ").first.flatMap { UInt64($0) }
    }

    @Test func aPollingLoopTakesTheNextMessageAwake() async throws {
        // The peer answers at once, well inside a 1 ms budget, so waits end while polling; a loop that does not
        // poll never counts one.
        // By design a poll stops early while the machine has more runnable threads than cores (RunQueueProbe): on
        // a machine that busy, a poll may never last long enough to be answered. So with no wait answered, the
        // polls must have been cut short for that, and fewer than twenty run their whole budget with a core to
        // spare: twenty of those unanswered is a loop that does not take what comes, and no poll at all one that
        // does not poll. (Sampling the machine after the rounds, as this test did, saw a core to spare that the
        // rounds had not had: it failed under two CPU hogs.)
        let polling = try EventLoop(name: "test-busy-poll", busyPollMicroseconds: 1000)
        for _ in 0..<5 where polling.busyPollHits == 0 {
            try await pingPong(polling, rounds: 200)
        }
        #expect(polling.busyPollHits >= 1 || (polling.busyPollCuts > 0 && polling.busyPollMisses < 20),
                "no wait answered by polling: \(polling.busyPollCuts) polls cut short, \(polling.busyPollMisses) full")
        await stopAndWait(polling)

        let sleeping = try EventLoop(name: "test-no-busy-poll")
        try await pingPong(sleeping, rounds: 200)
        #expect(sleeping.busyPollHits == 0)
        await stopAndWait(sleeping)
    }

    @Test func aPollStopsWhenTheMachineIsOversubscribed() {
        // Asked after the first empty poll: a yes ends the poll there, long before its budget.
        var polls = 0
        var asked = 0
        let n = busyPoll(nanoseconds: 60_000_000_000, stopsWhen: { asked += 1; return true }) { polls += 1; return 0 }
        #expect(n == 0 && polls == 1 && asked == 1)
        // A no lets it poll on, asking again after every fourth empty poll, until something comes.
        polls = 0
        asked = 0
        let found = busyPoll(nanoseconds: 60_000_000_000, stopsWhen: { asked += 1; return false }) {
            polls += 1
            return polls == 9 ? 1 : 0
        }
        #expect(found == 1 && polls == 9 && asked == 2)  // after empty polls 1 and 5
    }

    @Test func theRunQueueIsReadFromLoadavg() {
        func runnable(_ text: String) -> Int? {
            var text = text
            return text.withUTF8 { RunQueueProbe.runnable(in: UnsafeRawBufferPointer($0)) }
        }
        #expect(runnable("0.65 0.74 0.94 3/87 24560\n") == 3)
        #expect(runnable("12.00 9.10 8.00 130/2048 1") == 130)
        #expect(runnable("") == nil)
        #expect(runnable("0.65 0.74 0.94 /87 1") == nil)
        #expect(runnable("0.65 0.74 0.94 3x/87 1") == nil)
        #expect(runnable("0.65 0.74 0.94 3") == nil)
        #expect(runnable("0.65 0.74 0.94 1234567890/87 1") == nil)
        // Here /proc/loadavg is readable: the probe opens one descriptor and its close gives it back.
        let before = openDescriptors()
        let probe = RunQueueProbe()
        _ = probe.oversubscribed()
        #expect(openDescriptors().subtracting(before).filter { $0.hasSuffix(" /proc/loadavg") }.count == 1)
        probe.close()
        #expect(openDescriptors().subtracting(before).filter { $0.hasSuffix(" /proc/loadavg") }.isEmpty)
    }

    @Test func anIdleLoopPollsOnceThenSleeps() async throws {
        let loop = try EventLoop(name: "test-busy-poll-idle", busyPollMicroseconds: 1000)
        try await pingPong(loop, rounds: 50)
        // "<pid>/task/<tid>": the loop thread's own id, for its CPU time.
        let tid = await onLoop(loop) { () -> String in
            String(readLink("/proc/thread-self")?.split(separator: "/").last ?? "")
        }
        usleep(100_000)  // past the last poll
        let before = try #require(cpuNanoseconds(thread: tid))
        usleep(1_000_000)
        let after = try #require(cpuNanoseconds(thread: tid))
        // Asleep, it runs for nothing; polling on, it would run for a good part of the second even if it had to
        // share a CPU with two busy threads.
        #expect(after - before < 100_000_000, "the idle loop ran \((after - before) / 1000) us in 1 s")
        await stopAndWait(loop)
    }
}
