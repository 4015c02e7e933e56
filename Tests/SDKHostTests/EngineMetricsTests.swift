// EngineMetrics on its own: how a request's end is counted, the crash reports' fair share per extension, and
// the bound on leak reports.
import Testing
@testable import SDKHost

@Suite struct EngineMetricsTests {
    @Test func aRequestsEndIsCountedByOutcomeWithItsLatencyAndWhetherItWasSlow() {
        let metrics = EngineMetrics()
        let tally = metrics.tally("x")
        #expect(metrics.tally("x") === tally, "one tally per extension")
        let ms: UInt64 = 1_000_000
        #expect(!tally.record(.completed([]), elapsed: 2 * ms, slowThreshold: 100 * ms))
        #expect(tally.record(.completed([]), elapsed: 300 * ms, slowThreshold: 100 * ms))
        #expect(!tally.record(.cancelled(.cancelledByHost), elapsed: ms, slowThreshold: 100 * ms))
        #expect(!tally.record(.interrupted(.hang), elapsed: ms, slowThreshold: 100 * ms))
        #expect(!tally.record(.interrupted(.hang), elapsed: ms, slowThreshold: 100 * ms))
        #expect(tally.statistics.completions == 2 && tally.statistics.cancellations == 1)
        #expect(tally.statistics.interruptions == 2 && tally.activity.interruptionsByKind == ["hang": 2])
        #expect(tally.activity.slowRequests == 1 && tally.activity.slowNanoseconds == 300 * ms)
        let p50 = tally.activity.latency.percentile(0.5) ?? 0
        let p99 = tally.activity.latency.percentile(0.99) ?? 0
        #expect(abs(p50 - 0.002) < 0.0002 && abs(p99 - 0.3) < 0.02, "p50 \(p50) s, p99 \(p99) s")
        #expect(Set(metrics.extensionIDs) == ["x"])
    }

    @Test func aLoopingExtensionDoesNotPushTheOthersCrashReportsOut() {
        let metrics = EngineMetrics()
        func report(_ id: String, _ pid: Int32) -> CrashReport {
            CrashReport(extensionIdentifier: id, pid: pid, reason: .signal(11), time: 0, inFlightRequests: [], stderrTail: "")
        }
        metrics.addCrashReport(report("quiet", 1), limit: 4)
        metrics.addCrashReport(report("quiet", 2), limit: 4)
        for pid in Int32(10)..<Int32(30) { metrics.addCrashReport(report("loop", pid), limit: 4) }
        #expect(metrics.crashReports.count == 4)
        #expect(metrics.crashReports.map(\.pid) == [1, 2, 28, 29], "each keeps its share; the looper its newest")
    }

    @Test func onlyTheNewestLeakReportsAreKept() {
        let metrics = EngineMetrics()
        let total = EngineMetrics.recentLeakLimit + 5
        for pid in 0..<total {
            metrics.addLeak(LeakReport(extensionIdentifier: "x", pid: Int32(pid), requestID: RequestID(), alive: ["context"],
                                       afterMilliseconds: 1, time: 0))
        }
        #expect(metrics.recentLeaks.count == EngineMetrics.recentLeakLimit)
        #expect(metrics.recentLeaks.first?.pid == 5 && metrics.recentLeaks.last?.pid == Int32(total - 1))
    }

    @Test func workerTransitionsAreCountedByKindAndNamedWhenRead() {
        for phase in WorkerLifecycle.Phase.allCases { #expect(WorkerLifecycle.Phase.allCases[phase.index] == phase) }
        let metrics = EngineMetrics()
        #expect(metrics.transitions.isEmpty)
        metrics.countTransition(from: .starting, to: .ready)
        metrics.countTransition(from: .starting, to: .ready)
        metrics.countTransition(from: .ready, to: .dead)
        metrics.countTransition(from: .exiting, to: .dead)
        #expect(metrics.transitions == ["starting→ready": 2, "ready→dead": 1, "exiting→dead": 1])
    }
}
