// EngineMetrics: the engine's metrics job. Per extension its counters and what its requests did (latency,
// interruptions by kind, slow requests), the crash reports kept in memory (a fair share per extension), the
// newest leak reports, and how often each kind of worker transition happened. Loop-confined; `status`
// (HostStatus.swift) reads it, and nothing in it decides what the engine does (EngineMetricsTests).

/// The engine's figures. Loop-confined.
final class EngineMetrics {
    // Stored properties `@exclusivity(unchecked)`: see RequestTable.
    /// Each extension's counters and activity, made on first use; a request holds its extension's, so counting
    /// it costs no lookup by name.
    @exclusivity(unchecked) private(set) var tallies: [String: ExtensionTally] = [:]
    /// Crash reports kept in memory, oldest first (`addCrashReport`).
    @exclusivity(unchecked) private(set) var crashReports: [CrashReport] = []
    /// The newest leak reports, oldest first (at most `recentLeakLimit`).
    @exclusivity(unchecked) private(set) var recentLeaks: [LeakReport] = []
    static let recentLeakLimit = 32
    /// How many times each kind of worker transition happened (WorkerLifecycle): counted by phase pair, named
    /// ("starting→ready") only when read. A name built and hashed per transition was ~2 k instructions each.
    @exclusivity(unchecked) private(set) var transitionCounts: [Int] = Array(repeating: 0, count: phaseCount * phaseCount)
    private static let phases = WorkerLifecycle.Phase.allCases
    private static let phaseCount = phases.count
    /// The name of each kind counted in `transitionCounts`, at the same index ("starting→ready").
    static let transitionNames: [String] = (0..<phaseCount * phaseCount).map {
        "\(phases[$0 / phaseCount])→\(phases[$0 % phaseCount])"
    }

    /// Counts one worker transition.
    func countTransition(from: WorkerLifecycle.Phase, to: WorkerLifecycle.Phase) {
        transitionCounts[from.index * Self.phaseCount + to.index] += 1
    }

    /// How many times each kind of transition that happened did, by name ("starting→ready").
    var transitions: [String: Int] {
        var named: [String: Int] = [:]
        for (i, count) in transitionCounts.enumerated() where count > 0 { named[Self.transitionNames[i]] = count }
        return named
    }

    /// The extensions that have counted anything.
    var extensionIDs: Dictionary<String, ExtensionTally>.Keys { tallies.keys }

    /// `extensionID`'s counters and activity, made on first use.
    func tally(_ extensionID: String) -> ExtensionTally {
        if let tally = tallies[extensionID] { return tally }
        let tally = ExtensionTally()
        tallies[extensionID] = tally
        return tally
    }

    /// Keeps `report`; past `limit`, a looping extension does not push the other extensions' reports out: each
    /// keeps a fair share (`crashReportEvictions`).
    func addCrashReport(_ report: CrashReport, limit: Int) {
        crashReports.append(report)
        let evicted = crashReportEvictions(crashReports.map { $0.extensionIdentifier }, limit: limit)
        if !evicted.isEmpty {
            crashReports = crashReports.enumerated().filter { !evicted.contains($0.offset) }.map { $0.element }
        }
    }

    /// Keeps `report` among the newest `recentLeakLimit`.
    func addLeak(_ report: LeakReport) {
        recentLeaks.append(report)
        if recentLeaks.count > Self.recentLeakLimit { recentLeaks.removeFirst() }
    }
}

/// Counters since the host started.
package struct HostStatistics: Sendable, Equatable {
    package var completions = 0
    package var cancellations = 0
    package var interruptions = 0
    package var crashes = 0
    /// Workers killed as hung (missed heartbeats, or ignored a cancel).
    package var hangKills = 0
    package var timeouts = 0
    package var overloads = 0
    package var protocolViolations = 0
    package var spawns = 0
    package var requests = 0
    /// Requests whose context (or async Task) a worker reported alive `LeakCheckDelaySeconds` after they ended.
    package var leaks = 0
    package init() {}
}

/// Request latencies, log-linear: 16 buckets per power of two of microseconds (within about 3%). Fixed size.
struct LatencyHistogram: Sendable, Equatable {
    private var counts = [UInt64](repeating: 0, count: 38 * 16)
    private(set) var total: UInt64 = 0

    private static func bucket(_ microseconds: UInt64) -> Int {
        let v = max(microseconds, 1)
        let e = UInt64.bitWidth - v.leadingZeroBitCount - 1
        if e < 4 { return Int(v) }
        let index = (e - 3) * 16 + Int((v >> UInt64(e - 4)) & 15)
        return min(index, 38 * 16 - 1)
    }

    /// The middle of a bucket, in microseconds.
    private static func value(_ index: Int) -> Double {
        if index < 16 { return Double(index) }
        let e = index / 16 + 3
        let low = Double((16 + index % 16) << (e - 4))
        return low + Double(1 << (e - 4)) / 2
    }

    mutating func record(nanoseconds: UInt64) {
        counts[Self.bucket(nanoseconds / 1000)] += 1
        total += 1
    }

    /// The `p`-th percentile (0...1) in seconds, or nil with no samples.
    func percentile(_ p: Double) -> Double? {
        guard total > 0 else { return nil }
        let rank = max(1, UInt64((Double(total) * p).rounded(.up)))
        var seen: UInt64 = 0
        for (index, count) in counts.enumerated() where count > 0 {
            seen += count
            if seen >= rank { return Self.value(index) / 1e6 }
        }
        return nil
    }
}

/// An extension's counters and what its requests did. A class, so a request can keep its extension's and count
/// in place.
final class ExtensionTally {
    // Stored properties `@exclusivity(unchecked)`: see RequestTable.
    @exclusivity(unchecked) var statistics = HostStatistics()
    @exclusivity(unchecked) var activity = ExtensionActivity()

    /// Counts a request's end: its outcome, its latency (completions), its interruption's kind, and whether it
    /// ran past `slowThreshold` (returned, so the engine can log it). Mutated in place: a copy of the histogram
    /// per request would cost more than the rest.
    func record(_ outcome: RequestOutcome, elapsed: UInt64, slowThreshold: UInt64) -> Bool {
        switch outcome {
        case .completed:
            statistics.completions += 1
            activity.latency.record(nanoseconds: elapsed)
        case .cancelled:
            statistics.cancellations += 1
        case .interrupted(let reason):
            statistics.interruptions += 1
            activity.interruptionsByKind[reason.kind, default: 0] += 1
        }
        guard elapsed > slowThreshold else { return false }
        activity.slowRequests += 1
        activity.slowNanoseconds &+= elapsed
        return true
    }
}

/// What an extension's requests did: the figures behind `status`'s per-extension report.
struct ExtensionActivity {
    var requests = 0
    var interruptionsByKind: [String: Int] = [:]
    var latency = LatencyHistogram()
    /// Requests that ran past `SlowRequestThresholdMilliseconds`, and how long they ran in all.
    var slowRequests = 0
    var slowNanoseconds: UInt64 = 0
    var recycles = 0
    var quarantines = 0
}

/// Which reports to drop so that at most `limit` remain, each extension keeping a fair share: while over the
/// limit, the extension with the most reports loses its oldest. `owners` are the reports' extensions, oldest
/// first; the result is the indices to drop.
func crashReportEvictions(_ owners: [String], limit: Int) -> Set<Int> {
    guard owners.count > limit else { return [] }
    var byOwner: [String: [Int]] = [:]
    for (index, owner) in owners.enumerated() { byOwner[owner, default: []].append(index) }
    var dropped: Set<Int> = []
    var remaining = owners.count
    while remaining > limit {
        // The largest share; among equals, the one whose oldest report is oldest.
        guard let (owner, indices) = byOwner.max(by: { a, b in
            a.value.count != b.value.count ? a.value.count < b.value.count : a.value[0] > b.value[0]
        }) else { break }
        dropped.insert(indices[0])
        byOwner[owner] = indices.count > 1 ? Array(indices.dropFirst()) : nil
        remaining -= 1
    }
    return dropped
}
