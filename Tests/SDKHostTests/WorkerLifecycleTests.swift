// WorkerLifecycle on its own: which changes of phase are allowed, that every change records its cause, and how
// each way a worker can end is accounted for (crash or not, on its own or not, requests requeued or not).
import SDKPosix
import Testing
@testable import SDKHost

@Suite struct WorkerLifecycleTests {
    typealias Phase = WorkerLifecycle.Phase
    static let all: [Phase] = [.starting, .ready, .draining, .retiring, .killed, .exiting, .dead]

    @Test func onlyTheDrawnChangesAreAllowed() {
        let allowed: Set<String> = [
            "starting→ready", "starting→draining", "starting→retiring", "starting→killed", "starting→exiting",
            "starting→dead", "ready→draining", "ready→retiring", "ready→killed", "ready→exiting", "ready→dead",
            "draining→retiring", "draining→killed", "draining→exiting", "draining→dead", "retiring→killed",
            "retiring→exiting", "retiring→dead", "killed→exiting", "killed→dead", "exiting→dead",
        ]
        for from in Self.all {
            for to in Self.all {
                #expect(WorkerLifecycle.allows(from, to) == allowed.contains("\(from)→\(to)"), "\(from) → \(to)")
            }
        }
    }

    @Test func eventsMoveThePhaseAndRecordWhy() {
        var life = WorkerLifecycle()
        #expect(life.phase == .starting && life.phase.isLive && !life.welcomed)
        let moved1 = life.welcome()
        #expect(moved1)
        #expect(life.phase == .ready && life.welcomed)
        let moved2 = life.welcome()
        #expect(!moved2, "a second welcome is a protocol violation")
        let moved3 = life.recycle("MaxRequestsPerWorker 3")
        #expect(moved3)
        #expect(life.phase == .draining && !life.phase.isLive && life.phase.isRunning && life.recycleReason == "MaxRequestsPerWorker 3")
        let moved4 = life.recycle("again")
        #expect(!moved4, "recycled once")
        let moved5 = life.retire("recycled and drained")
        #expect(moved5)
        let moved6 = life.markKilled(.hostShutdown)
        #expect(moved6)
        let moved7 = life.markKilled(.hang)
        #expect(!moved7, "the first kill's reason stands")
        #expect(life.kill?.reason == .hostShutdown)
        let moved8 = life.reaped(.signaled(9))
        #expect(moved8)
        #expect(life.phase == .dead && life.phase.isOver)
        #expect(life.history.map(\.to) == [.ready, .draining, .retiring, .killed, .dead])
        #expect(life.history.map(\.cause) == ["welcome", "recycled: MaxRequestsPerWorker 3", "recycled and drained",
                                              "killed: host shut down", "reaped: signal 9 (SIGKILL)"])
        let moved9 = life.retire("late")
        #expect(!moved9, "nothing moves a dead worker")
    }

    @Test func aWorkerKilledOrRecycledBeforeItsHandshakeStaysSoWhenItsWelcomeComes() {
        var killed = WorkerLifecycle()
        let moved10 = killed.markKilled(.protocolViolation("garbage"))
        #expect(moved10)
        let moved11 = killed.welcome()
        #expect(moved11)
        #expect(killed.phase == .killed && killed.welcomed && killed.beforeWelcome == false)
        var retiring = WorkerLifecycle()
        let moved12 = retiring.retire("host stopping")
        #expect(moved12)
        let moved13 = retiring.welcome()
        #expect(!moved13, "a welcome after the socket closed is not expected")
    }

    @Test func aWelcomeReadAfterTheWorkersDeathStillCounts() {
        // Read from its socket once it was reaped: a handler may have run, so its requests are not sent again.
        var life = WorkerLifecycle()
        _ = life.reaped(.signaled(11))
        let welcomed = life.welcome()
        #expect(welcomed && life.welcomed && life.phase == .dead)
        #expect(!Self.ending(life, .signaled(11)).requeuesRequests)
    }

    @Test func halfAFrameLeftOnTheSocketOfAnExitedWorkerIsWhyItsRequestsEnd() {
        // Its exit notice came first (the kernel walks the robust list before it closes the socket), then the
        // host read half a frame: a truncated frame, not a clean exit 0.
        var life = WorkerLifecycle()
        _ = life.welcome()
        life.brokeProtocolAfterEnd("too early")
        #expect(life.violationAfterEnd == nil, "a running worker is killed for a violation instead")
        _ = life.noticeExit(.exited(0))
        life.brokeProtocolAfterEnd("truncated frame")
        life.brokeProtocolAfterEnd("a second one")
        #expect(Self.ending(life, .exited(0)) == .init(reason: .protocolViolation("truncated frame"), crashed: true,
                                                       diedOnItsOwn: true, requeuesRequests: false))
        // Idle when it did so: a crash all the same.
        #expect(Self.ending(life, .exited(0), requests: false).crashed)
        // Killed by the host first: that reason stands.
        var killed = WorkerLifecycle()
        _ = killed.welcome()
        _ = killed.markKilled(.hang)
        _ = killed.reaped(.signaled(9))
        killed.brokeProtocolAfterEnd("truncated frame")
        #expect(Self.ending(killed, .signaled(9)).reason == .hang)
    }

    @Test func theHistoryKeepsTheLastChanges() {
        var life = WorkerLifecycle()
        _ = life.welcome()
        _ = life.recycle("r")
        _ = life.retire("drained")
        _ = life.markKilled(.hostShutdown)
        _ = life.noticeExit(.signaled(9))
        _ = life.reaped(.signaled(9))
        #expect(life.history.count == 6)
        #expect(life.history.first?.from == .starting && life.history.last?.to == .dead)
        #expect(life.history.count <= WorkerLifecycle.historyLimit)
    }

    static func ending(_ life: WorkerLifecycle, _ status: SDKPosix.ExitStatus?, requests: Bool = true,
                       livedPastIdleTimeout: Bool = true, launchFailure: String? = nil,
                       shuttingDown: Bool = false) -> WorkerLifecycle.Ending {
        life.ending(status: status, hadRequests: requests, livedPastIdleTimeout: livedPastIdleTimeout,
                    launchFailure: launchFailure, launcherFailureStatus: 125, shuttingDown: shuttingDown)
    }

    @Test func endingsAreAccountedForOnce() {
        var ready = WorkerLifecycle()
        _ = ready.welcome()
        // A crash on its own: its signal, a crash, counts toward quarantine, requests not requeued (a handler ran).
        #expect(Self.ending(ready, .signaled(11)) == .init(reason: .signal(11), crashed: true, diedOnItsOwn: true, requeuesRequests: false))
        // An idle worker that exits 0: nothing to report.
        #expect(!Self.ending(ready, .exited(0), requests: false).crashed)
        // Sooner than its idle timeout, or before its handshake, an exit 0 is no clean stop.
        #expect(Self.ending(ready, .exited(0), requests: false, livedPastIdleTimeout: false).diedOnItsOwn)
        #expect(Self.ending(WorkerLifecycle(), .exited(0), requests: false).diedOnItsOwn)
        // Died before its handshake, on its own: its requests wait for the next worker, unless the host stops.
        let fresh = WorkerLifecycle()
        #expect(Self.ending(fresh, .signaled(11)).requeuesRequests)
        #expect(!Self.ending(fresh, .signaled(11), shuttingDown: true).requeuesRequests)
        // The launcher's failure, told and then exited with its status.
        #expect(Self.ending(fresh, .exited(125), launchFailure: "no seccomp").reason == .launchFailed("no seccomp"))
        #expect(!Self.ending(fresh, .exited(125), launchFailure: "no seccomp").requeuesRequests)
        // Killed for ignoring a cancel: a crash (requests interrupted as hang), but the host's decision.
        var stubborn = ready
        _ = stubborn.markKilled(.hang, forCancel: true)
        #expect(Self.ending(stubborn, .signaled(9)) == .init(reason: .hang, crashed: true, diedOnItsOwn: false, requeuesRequests: false))
        // Missed heartbeats: on its own.
        var hung = ready
        _ = hung.markKilled(.hang)
        #expect(Self.ending(hung, .signaled(9)).diedOnItsOwn)
        // Retired, then killed at the end of its grace at shutdown: not a crash.
        var retired = ready
        _ = retired.retire("host stopping")
        _ = retired.markKilled(.hostShutdown)
        #expect(!Self.ending(retired, .signaled(9)).crashed)
        // Retired, but it crashed on its way out: the retirement covers it (its requests were done).
        #expect(!Self.ending(retired, .signaled(11)).crashed)
        // Killed at shutdown without being retired first: a crash for the requests it had.
        var stopped = ready
        _ = stopped.markKilled(.hostShutdown)
        #expect(Self.ending(stopped, .signaled(9)) == .init(reason: .hostShutdown, crashed: true, diedOnItsOwn: false, requeuesRequests: false))
        // A protocol violation counts as on its own.
        var rude = ready
        _ = rude.markKilled(.protocolViolation("garbage"))
        #expect(Self.ending(rude, .signaled(9)).diedOnItsOwn)
    }
}

/// A request's phases (RequestRecord.swift): which changes are allowed, and that the queue and the engine make
/// them.
@Suite struct RequestPhaseTests {
    @Test func onlyTheDrawnChangesAreAllowed() {
        let all: [RequestPhase] = [.begun, .queued, .running, .ended]
        let allowed: Set<String> = ["begun→queued", "begun→running", "queued→running", "running→queued",
                                    "begun→ended", "queued→ended", "running→ended"]
        for from in all {
            for to in all {
                #expect(RequestPhase.allows(from, to) == allowed.contains("\(from)→\(to)"), "\(from) → \(to)")
            }
        }
    }

    @Test func theQueueMovesARequestAndRecordsWhy() {
        let record = RequestRecord(id: RequestID(), extensionID: "x", items: [], deadline: nil, deliver: { _ in })
        let queue = RequestQueue()
        queue.append(record)
        #expect(record.phase == .queued && record.isQueued)
        #expect(queue.popFirst() === record)
        let sent = record.move(to: .running, because: "sent to a worker")
        #expect(sent && record.phase == .running)
        queue.prepend(record)
        #expect(record.phase == .queued)
        _ = queue.popFirst()
        let ended = record.move(to: .ended, because: "its outcome")
        #expect(ended && record.phase == .ended)
        #expect(record.history.map(\.to) == [.queued, .running, .queued, .ended])
        #expect(record.history.map { "\($0.cause)" } == ["no worker with room", "sent to a worker",
                                                         "its worker died before its handshake", "its outcome"])
    }
}
