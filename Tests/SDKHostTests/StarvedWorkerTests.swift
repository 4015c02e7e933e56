// A worker past its heartbeat timeout is killed as hung unless the scheduler is not running it: runnable, with
// almost no CPU since (HostEngine.starvedNotHung). A loaded suite showed the case: a new worker, runnable,
// waited 9.3 s for a CPU and ran 22 ms while two busy processes ran, and was killed as hung. Driven here with a
// manual clock and a fake worker whose scheduler times the test sets.
import SDKWire
import HostTestSupport
@testable import SDKHost
import SDKPosix
import SDKSimulation
import Synchronization
import Testing
import Dispatch

#if canImport(Glibc)
import Glibc
#endif

/// A value shared with the engine's callbacks.
final class Shared<Value: Sendable>: Sendable {
    let value: Mutex<Value>
    init(_ value: Value) { self.value = Mutex(value) }
    func withLock<R>(_ body: (inout Value) -> R) -> R { value.withLock { body(&$0) } }
}

@Suite(.serialized) struct StarvedWorkerTests {
    /// An engine on its own loop with a manual clock, one fake worker serving one request that never ends, and
    /// what it logs. The worker has answered its hello; it never answers a ping.
    final class Rig {
        let temp: TemporaryExtension
        let clock = ManualClock()
        let launcher = SimLauncher()
        let engine: HostEngine
        let log = Shared<[String]>([])
        let worker: FakeWorker
        let outcome = Shared<RequestOutcome?>(nil)

        init(deadline: Double? = nil) async throws {
            // A long deadline: the default (30 s) would end the request while the starved worker is waited for.
            let temp = TemporaryExtension(identifier: "com.example.starved", executable: "Echo", policy: """
                <key>RequestDeadlineSeconds</key><real>600</real>
                """)
            self.temp = temp
            let clock = self.clock, launcher = self.launcher
            var configuration = HostConfiguration(extensionSearchPaths: [temp.root])
            configuration.clock = clock
            configuration.exitNoticeWatcher = launcher.notices
            configuration.launcher = launcher
            configuration.logLevel = .warning
            let log = self.log
            configuration.logHandler = { _, line in log.withLock { $0.append(line) } }
            configuration.heartbeatInterval = .seconds(1)
            configuration.heartbeatTimeout = .seconds(3)
            configuration.cancelGracePeriod = .seconds(2)
            let engine = try HostEngine(configuration: configuration)
            self.engine = engine
            let outcome = self.outcome
            engine.submit(SubmittedRequest(
                id: RequestID(high: 1, low: 2), extensionID: "com.example.starved", items: [], deadline: deadline,
                onWorkerAssigned: nil, deliver: { result in outcome.withLock { $0 = result } }))
            var found: FakeWorker?
            for _ in 0..<2000 where found == nil {
                await Self.settle(engine)
                found = launcher.workers.first
                if let found { _ = found.pump(identifier: "com.example.starved") }  // its hello, answered
            }
            let worker = try #require(found)
            await Self.settle(engine)
            _ = worker.pump(identifier: "com.example.starved")  // the begin
            #expect(worker.begins.count == 1)
            worker.answersPings = false
            self.worker = worker
        }

        static func settle(_ engine: HostEngine) async {
            for _ in 0..<4 {
                await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                    if !engine.loop.execute({ c.resume() }) { c.resume() }
                }
            }
        }

        func settle() async { await Self.settle(engine) }

        /// Moves the clock on by `seconds`, a tenth of a second at a time, with the worker's CPU time growing by
        /// `cpuShare` of the time. A silent worker reads nothing (its ping waits for it); one that answers reads
        /// and answers at each tenth. The first ping goes at 1 s, and the timeout is 3 s: a silent worker is first
        /// past it at the tick of 5 s, and waited for (if starved) until 30 s after its ping.
        func advance(_ seconds: Double, cpuShare: Double, runnable: Bool = true, lowPriority: Bool = false) async {
            for _ in 0..<Int(seconds * 10) {
                worker.shared.withLock { s in
                    let ran = (s.scheduler?.ranNanoseconds ?? 0) + UInt64(cpuShare * 100_000_000)
                    s.scheduler = SchedulerTimes(runnable: runnable, lowPriority: lowPriority, ranNanoseconds: ran, waitedNanoseconds: 0)
                }
                clock.advance(by: 100_000_000)
                engine.loop.wake()
                await settle()
                // Killed: it dies (as the simulation's workers do when they next run).
                if worker.alive, worker.shared.withLock({ $0.killRequested }) { worker.die(.signaled(SIGKILL)) }
                if worker.answersPings { _ = worker.pump(identifier: "com.example.starved") }
            }
            await settle()
        }

        var killed: Bool { worker.shared.withLock { $0.killRequested } }

        func finish() async {
            let stopped = Mutex(false)
            engine.shutdown { stopped.withLock { $0 = true } }
            for _ in 0..<200 where !stopped.withLock({ $0 }) {
                await settle()
                if worker.shared.withLock({ $0.killRequested }) { worker.die(.signaled(SIGKILL)) }
                if worker.pump(identifier: "com.example.starved") { worker.die(.exited(0)) }
                clock.advance(by: 200_000_000)
                engine.loop.wake()
            }
            temp.remove()
        }
    }

    @Test func aRunnableWorkerTheMachineDoesNotRunIsNotKilledForThirtySeconds() async throws {
        let rig = try await Rig()
        // 2% of a CPU, runnable throughout: past the 3 s timeout (the tick of 5 s) it is watched, not killed.
        await rig.advance(28.5, cpuShare: 0.02)
        #expect(!rig.killed, "\(rig.log.withLock { $0 })")
        #expect(rig.log.withLock { $0.contains { $0.contains("but is runnable") && $0.contains("waiting to see whether it gets one") } })
        // 30 s after its ping (1 s; four timeouts would be 12 s) it is killed as hung, whatever it was given: at
        // the tick of 32 s.
        await rig.advance(2.8, cpuShare: 0.02)
        #expect(!rig.killed)
        await rig.advance(1.0, cpuShare: 0.02)
        #expect(rig.killed)
        await rig.finish()
        #expect(rig.outcome.withLock { $0 } == .interrupted(.hang))
    }

    @Test func aWorkerThatRunsAndDoesNotAnswerIsKilledAtTheFirstLookAfterItsTimeout() async throws {
        let rig = try await Rig()
        // Half a CPU and no answer: a busy loop. Seen runnable at the tick of 5 s, killed at the next.
        await rig.advance(5.5, cpuShare: 0.5)
        #expect(!rig.killed)
        await rig.advance(1.0, cpuShare: 0.5)
        #expect(rig.killed, "\(rig.log.withLock { $0 })")
        await rig.finish()
        #expect(rig.outcome.withLock { $0 } == .interrupted(.hang))
    }

    @Test func aWorkerAsleepOrUnreadableIsKilledAtItsTimeout() async throws {
        let rig = try await Rig()
        // Not runnable (asleep in a call, stopped, stuck): its silence is its own, killed at the tick of 5 s.
        await rig.advance(4.5, cpuShare: 0, runnable: false)
        #expect(!rig.killed)
        await rig.advance(1.0, cpuShare: 0, runnable: false)
        #expect(rig.killed, "\(rig.log.withLock { $0 })")
        #expect(!rig.log.withLock { $0.contains { $0.contains("but is runnable") } })
        await rig.finish()
        #expect(rig.outcome.withLock { $0 } == .interrupted(.hang))
    }

    @Test func aStarvedWorkerThatAnswersAtLastIsKeptAndJudgedAfreshNextTime() async throws {
        let rig = try await Rig()
        // Starved from its first ping (1 s), first looked at at 5 s.
        await rig.advance(8, cpuShare: 0.01)
        #expect(!rig.killed)
        // It gets CPU (a second of it) and answers: kept.
        rig.worker.answersPings = true
        await rig.advance(0.5, cpuShare: 2.0)
        rig.worker.answersPings = false
        // Silent again: its next ping goes at 9 s, and at 13 s it is past the timeout, looked at afresh and kept.
        // Judged from the look of 5 s instead, the second it had would count against it and it would be killed.
        await rig.advance(5, cpuShare: 0.01)
        #expect(!rig.killed, "\(rig.log.withLock { $0 })")
        await rig.finish()
        #expect(rig.outcome.withLock { $0 } == .interrupted(.hostShutdown))
    }

    @Test func aWorkerThatLoweredItsOwnPriorityIsKilledAtItsTimeout() async throws {
        let rig = try await Rig()
        rig.worker.shared.withLock { $0.scheduler = SchedulerTimes(runnable: true, lowPriority: true, ranNanoseconds: 0, waitedNanoseconds: 0) }
        // Runnable, starved, but at SCHED_IDLE or nice above 0 by its own choice: no benefit of the doubt.
        await rig.advance(5.5, cpuShare: 0, lowPriority: true)
        #expect(rig.killed, "\(rig.log.withLock { $0 })")
        await rig.finish()
    }

    @Test func procStatIsReadAsBytesAfterTheLastParenthesis() throws {
        // A thread names itself: a ')' and a Unicode prepend character must not move the fields.
        let line = Array("4242 (x) R \u{0600}) S 1 4242 4242 0 -1 4194560 10 0 0 0 7 3 0 0 20 0 1 0\n".utf8)
        let fields = try #require(statFields(line))
        #expect(String(decoding: fields[0], as: UTF8.self) == "S")
        #expect(String(decoding: fields[11], as: UTF8.self) == "7" && String(decoding: fields[12], as: UTF8.self) == "3")
        // This process, read while this thread runs: runnable, and it has had CPU.
        let mine = try #require(SchedulerTimes(readingProcess: getpid()))
        #expect(mine.runnable && mine.ranNanoseconds > 0)
    }

    @Test func aCancelIgnoredByAWorkerTheMachineDoesNotRunIsNotKilledForThirtySeconds() async throws {
        // The deadline (1 s) cancels the request at its worker; the grace period is 2 s. The heartbeat's own
        // judgement kills it at 32 s; the cancel's at the first grace tick past 31 s (1 + 30): 33 s.
        let rig = try await Rig(deadline: 1)
        await rig.advance(30.5, cpuShare: 0.01)
        #expect(!rig.killed, "\(rig.log.withLock { $0 })")
        #expect(rig.log.withLock { $0.contains { $0.contains("has not acknowledged the cancel") && $0.contains("but is runnable") } })
        await rig.advance(3.0, cpuShare: 0.01)
        #expect(rig.killed, "\(rig.log.withLock { $0 })")
        #expect(rig.log.withLock { $0.contains { $0.contains("ignored the cancel") } })
        await rig.finish()
        #expect(rig.outcome.withLock { $0 } == .interrupted(.timedOut))
    }

    // A host behind its worker (a daemon busy with other clients, its loop late) is not the worker's silence: an
    // attack of twenty clients sending 1 MiB echoes and never reading had the daemon kill well-behaved Echo workers
    // as hung, each blocked writing its reply to a daemon that had not read it yet.

    /// Stalls the engine's loop while the worker writes more than the loop reads in one turn (three 50 KB error
    /// reports; then its pong, if `answering`) and the clock moves on by `seconds`: when the loop runs again, the
    /// heartbeat's timer fires in the same turn as the first read, with the rest (and the pong) still unread.
    func stallHost(_ rig: Rig, seconds: Double, answering: Bool) async {
        // The loop is held inside a task before the worker writes: else it could read a turn's worth first.
        let entered = DispatchSemaphore(value: 0), gate = DispatchSemaphore(value: 0)
        #expect(rig.engine.loop.execute { entered.signal(); gate.wait() })
        entered.wait()
        for _ in 0..<3 { rig.worker.send(.error(message: String(repeating: "x", count: 50_000), id: nil)) }
        if answering {
            let answers = rig.worker.answersPings
            rig.worker.answersPings = true
            _ = rig.worker.pump(identifier: "com.example.starved")
            rig.worker.answersPings = answers
        }
        rig.clock.advance(by: UInt64(seconds * 1e9))
        gate.signal()
        await rig.settle()
        if rig.worker.alive, rig.killed { rig.worker.die(.signaled(SIGKILL)) }
    }

    @Test func aWorkerWhosePongWaitsUnreadBehindItsOutputIsNotKilled() async throws {
        let rig = try await Rig()
        // Not runnable throughout (asleep writing): the machine's load is no excuse. The ping goes at 1 s.
        await rig.advance(1.05, cpuShare: 0, runnable: false)
        // At 6 s, 5 s after its ping, the loop comes back: the pong is there, unread behind 150 KB. Judged by the
        // time since its ping, the worker is killed; the host was behind it the whole time.
        await stallHost(rig, seconds: 5, answering: true)
        #expect(!rig.killed, "\(rig.log.withLock { $0 })")
        // Read at the next turn, the pong answers its ping: the next ping (at 7 s) starts afresh.
        await rig.advance(2.0, cpuShare: 0, runnable: false)
        #expect(!rig.killed, "\(rig.log.withLock { $0 })")
        // Silent from then on, it is charged as before: killed 3 s after that ping.
        await rig.advance(3.5, cpuShare: 0, runnable: false)
        #expect(rig.killed, "\(rig.log.withLock { $0 })")
        await rig.finish()
        #expect(rig.outcome.withLock { $0 } == .interrupted(.hang))
    }

    @Test func aWorkerThatKeepsTheHostBehindWithoutAnsweringIsKilledAtTheStarvationLimit() async throws {
        let rig = try await Rig()
        await rig.advance(1.05, cpuShare: 0, runnable: false)
        // Every second the host is behind its output, and it never answers: not charged, so only the limit on
        // an excuse (30 s from its ping, as for a starved worker) ends it, at the first look past 31 s.
        for _ in 0..<29 { await stallHost(rig, seconds: 1, answering: false) }
        #expect(!rig.killed, "\(rig.log.withLock { $0 })")
        for _ in 0..<3 { await stallHost(rig, seconds: 1, answering: false) }
        #expect(rig.killed, "\(rig.log.withLock { $0 })")
        #expect(rig.log.withLock { $0.contains { $0.contains("missed heartbeats for 0.0 s (3") } }, "\(rig.log.withLock { $0.filter { !$0.contains("reported an error") } })")
        await rig.finish()
        #expect(rig.outcome.withLock { $0 } == .interrupted(.hang))
    }

    @Test func aCancelWhoseAcknowledgementWaitsBehindTheWorkersOutputIsNotCountedAgainstIt() async throws {
        let rig = try await Rig(deadline: 1)
        rig.worker.answersPings = true
        // The deadline (1 s) sends the cancel; the grace period is 2 s. The worker is asleep (no starvation excuse).
        await rig.advance(1.05, cpuShare: 0, runnable: false)
        #expect(rig.worker.cancelRequested.count == 1)
        // At 3.55 s the loop comes back with 150 KB of the worker's unread: the host is behind it, not it silent.
        await stallHost(rig, seconds: 2.5, answering: true)
        #expect(!rig.killed, "\(rig.log.withLock { $0.filter { !$0.contains("reported an error") } })")
        // It acknowledges: the slot is free, nothing is killed.
        rig.worker.send(.cancelled(id: RequestID(high: 1, low: 2), error: .cancelledByHost))
        await rig.advance(4, cpuShare: 0, runnable: false)
        #expect(!rig.killed, "\(rig.log.withLock { $0.filter { !$0.contains("reported an error") } })")
        await rig.finish()
        #expect(rig.outcome.withLock { $0 } == .interrupted(.timedOut))
    }

    @Test func aCancelIgnoredByAWorkerAsleepIsKilledAfterOneGracePeriod() async throws {
        let rig = try await Rig(deadline: 1)
        await rig.advance(2.5, cpuShare: 0, runnable: false)
        #expect(!rig.killed)
        await rig.advance(1.0, cpuShare: 0, runnable: false)
        #expect(rig.killed, "\(rig.log.withLock { $0 })")
        #expect(rig.log.withLock { $0.contains { $0.contains("ignored the cancel") } })
        await rig.finish()
    }
}
