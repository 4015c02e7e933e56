// HostStatus: what `sdk-host status` shows, as public values. The daemon sends it as a plist (`statusReport`);
// an embedded host builds it on its loop. Both read the same engine figures.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix

/// A host's status: its extensions, their workers and what their requests did.
public struct HostStatus: Sendable, Equatable {
    /// The host's pid (the daemon's, or the app's for an embedded host).
    public var pid: Int32
    public var uptimeSeconds: Double
    /// Requests begun and not ended, and how many of them wait for a worker.
    public var activeRequests: Int
    public var queuedRequests: Int
    /// One entry per extension that has had a request or a worker, sorted by identifier.
    public var extensions: [ExtensionStatus]
    /// The newest crash reports (at most 8, oldest first; each stderr tail cut to its last 2 KiB).
    public var recentCrashes: [CrashReport] = []
    /// The newest leak reports (at most 32, oldest first).
    public var recentLeaks: [LeakReport] = []
}

/// Whether an extension (or one app's pool of it) may start workers.
public enum SupervisionState: String, Sendable, Equatable {
    /// Healthy.
    case running
    /// Its workers kept dying on their own: requests end at once as `quarantined` until the backoff passes.
    case quarantined
    /// The backoff has passed; the next success clears it, the next death quarantines it for twice as long.
    case probation
}

/// One extension's figures since the host started.
public struct ExtensionStatus: Sendable, Equatable {
    public var identifier: String
    /// The worst state of its pools (quarantined, then probation, then running).
    public var state: SupervisionState
    /// Workers that died on their own within `RestartLimitIntervalSeconds` (the most of any pool).
    public var crashCount: Int
    /// Seconds until a quarantine ends (the soonest of its pools), or nil when not quarantined.
    public var retryInSeconds: Double?
    /// Requests begun, and how they ended.
    public var requests: Int
    public var completions: Int
    public var cancellations: Int
    public var interruptions: Int
    /// Interruptions by `InterruptionReason.kind`.
    public var interruptionsByReason: [String: Int]
    /// Latency of completed requests, in milliseconds (nil before the first).
    public var latencyP50Milliseconds: Double?
    public var latencyP99Milliseconds: Double?
    /// Requests that ran longer than `SlowRequestThresholdMilliseconds`, per 1000 requests, and their total time.
    public var slowRequests: Int
    public var slowRequestsPer1000: Double
    public var slowRequestSeconds: Double
    /// Workers that did not end cleanly; killed as hung; requests past their deadline; ended `overloaded`.
    public var crashes: Int
    public var hangKills: Int
    public var timeouts: Int
    public var overloads: Int
    public var protocolViolations: Int
    public var spawns: Int
    public var recycles: Int
    public var quarantines: Int
    /// Requests its workers reported as leaked: the request's context, or an async handler's Task, still alive
    /// `LeakCheckDelaySeconds` after the request ended.
    public var leaks: Int
    /// Its pools: one in an embedded host; in the daemon one per client app of a `perApp` extension.
    public var pools: [PoolStatus]
    public var workers: [WorkerStatus]
}

/// One pool of an extension's workers.
public struct PoolStatus: Sendable, Equatable {
    /// The daemon client app it serves ("uid/name"), or nil for the extension's own (shared or warm) pool.
    public var app: String?
    public var state: SupervisionState
    public var crashCount: Int
    public var retryInSeconds: Double?
    /// The length of its current or last quarantine, in seconds (0 when healthy).
    public var backoffSeconds: Double
}

/// One live worker.
public struct WorkerStatus: Sendable, Equatable {
    public var pid: Int32
    /// The daemon client app it serves, or nil.
    public var app: String?
    public var uptimeSeconds: Double
    public var inFlight: Int
    /// Requests sent to it so far.
    public var requestsServed: Int
    /// Whether it is draining to be replaced (`MaxRequestsPerWorker`, `MaxWorkerRSSMB`).
    public var recycling: Bool
    /// The sandbox layers its launcher reported, and what bestEffort left out.
    public var sandbox: [String]
    public var sandboxSkipped: [String]
}

extension HostEngine {
    /// The status, read on the loop.
    package func statusOnLoop() -> HostStatus {
        let now = loop.now
        // Every installed extension, used or not, so an operator sees what could run.
        let ids = Set(manifests.keys).union(tallies.keys).union(workers.values.joined().map(\.extensionID)).union(pools.values.map(\.extensionID))
        let extensions = ids.sorted().map { id -> ExtensionStatus in
            let c = tallies[id]?.statistics ?? HostStatistics()
            let a = tallies[id]?.activity ?? ExtensionActivity()
            // Pools with a crash record, and pools that only have workers.
            let keys = Set(pools.values.filter { $0.extensionID == id }.map(\.key))
                .union(workers.filter { $0.value.first?.extensionID == id }.map(\.key))
            let poolStates = keys.sorted().map { key in
                let p = pools[key] ?? PoolState(key: key, extensionID: id, app: workers[key]?.first?.app, restartWindow: 0)
                let health = p.health(now: now)
                return PoolStatus(
                    app: p.app, state: SupervisionState(rawValue: health.rawValue) ?? .running,
                    crashCount: p.recentDeathCount(now: now),
                    retryInSeconds: health == .quarantined ? Double((p.quarantinedUntil ?? now) &- now) / 1e9 : nil,
                    backoffSeconds: p.backoff)
            }
            let state: SupervisionState = poolStates.contains { $0.state == .quarantined } ? .quarantined
                : poolStates.contains { $0.state == .probation } ? .probation : .running
            let workerStates = workers.values.joined().filter { $0.extensionID == id }.map { w in
                WorkerStatus(pid: w.pid, app: w.app, uptimeSeconds: Double(now &- w.startedAt) / 1e9,
                             inFlight: w.inFlight.count, requestsServed: w.requestsSent, recycling: w.lifecycle.recycleReason != nil,
                             sandbox: w.sandboxLayers, sandboxSkipped: w.sandboxSkipped)
            }.sorted { $0.pid < $1.pid }
            return ExtensionStatus(
                identifier: id, state: state, crashCount: poolStates.map(\.crashCount).max() ?? 0,
                retryInSeconds: poolStates.compactMap(\.retryInSeconds).min(),
                requests: c.requests, completions: c.completions, cancellations: c.cancellations,
                interruptions: c.interruptions, interruptionsByReason: a.interruptionsByKind,
                latencyP50Milliseconds: a.latency.percentile(0.5).map { $0 * 1000 },
                latencyP99Milliseconds: a.latency.percentile(0.99).map { $0 * 1000 },
                slowRequests: a.slowRequests, slowRequestsPer1000: c.requests > 0 ? Double(a.slowRequests) * 1000 / Double(c.requests) : 0,
                slowRequestSeconds: Double(a.slowNanoseconds) / 1e9, crashes: c.crashes, hangKills: c.hangKills,
                timeouts: c.timeouts, overloads: c.overloads, protocolViolations: c.protocolViolations,
                spawns: c.spawns, recycles: a.recycles, quarantines: a.quarantines, leaks: c.leaks, pools: poolStates,
                workers: workerStates)
        }
        let crashes = crashReports.suffix(8).map { report in
            var report = report
            report.stderrTail = String(decoding: Array(report.stderrTail.utf8.suffix(2048)), as: UTF8.self)
            return report
        }
        return HostStatus(pid: getpid(), uptimeSeconds: Double(monotonicNanoseconds() &- startedAt) / 1e9,
                          activeRequests: requests.count,
                          queuedRequests: waiting.values.reduce(0) { $0 + $1.count }, extensions: extensions,
                          recentCrashes: Array(crashes), recentLeaks: recentLeaks)
    }
}

// MARK: The plist form (status --json prints it as JSON)

extension HostStatus {
    /// The `statusReport` plist; `sdk-host status --json` prints it as JSON.
    public var plist: PlistValue {
        var totals = [String: PlistValue]()
        for key in ExtensionStatus.counterKeys {
            totals[key] = .integer(Int64(extensions.reduce(0) { $0 + ($1.counter(key) ?? 0) }))
        }
        return ["pid": .integer(Int64(pid)), "uptimeSeconds": .real(uptimeSeconds),
                "activeRequests": .integer(Int64(activeRequests)), "queuedRequests": .integer(Int64(queuedRequests)),
                "totals": .dictionary(totals), "extensions": .array(extensions.map(\.plist)),
                "recentCrashes": .array(recentCrashes.map(\.plist)), "recentLeaks": .array(recentLeaks.map(\.plist))]
    }

    /// Reads a `statusReport` plist; missing fields read as zero.
    public init(plist p: PlistValue) {
        pid = Int32(truncatingIfNeeded: p["pid"]?.integerValue ?? 0)
        uptimeSeconds = p["uptimeSeconds"]?.doubleValue ?? 0
        activeRequests = Int(p["activeRequests"]?.integerValue ?? 0)
        queuedRequests = Int(p["queuedRequests"]?.integerValue ?? 0)
        extensions = (p["extensions"]?.arrayValue ?? []).map(ExtensionStatus.init(plist:))
        recentCrashes = (p["recentCrashes"]?.arrayValue ?? []).compactMap(CrashReport.init(plist:))
        recentLeaks = (p["recentLeaks"]?.arrayValue ?? []).compactMap(LeakReport.init(plist:))
    }
}

extension ExtensionStatus {
    static let counterKeys = ["requests", "completions", "cancellations", "interruptions", "slowRequests", "crashes",
                              "hangKills", "timeouts", "overloads", "protocolViolations", "spawns", "recycles",
                              "quarantines", "leaks"]

    func counter(_ key: String) -> Int? {
        switch key {
        case "requests": requests
        case "completions": completions
        case "cancellations": cancellations
        case "interruptions": interruptions
        case "slowRequests": slowRequests
        case "crashes": crashes
        case "hangKills": hangKills
        case "timeouts": timeouts
        case "overloads": overloads
        case "protocolViolations": protocolViolations
        case "spawns": spawns
        case "recycles": recycles
        case "quarantines": quarantines
        case "leaks": leaks
        default: nil
        }
    }

    var plist: PlistValue {
        var d: [String: PlistValue] = ["identifier": .string(identifier), "state": .string(state.rawValue),
                                       "crashCount": .integer(Int64(crashCount))]
        for key in Self.counterKeys { d[key] = .integer(Int64(counter(key) ?? 0)) }
        if let retryInSeconds { d["retryInSeconds"] = .real(retryInSeconds) }
        if let latencyP50Milliseconds { d["latencyP50Milliseconds"] = .real(latencyP50Milliseconds) }
        if let latencyP99Milliseconds { d["latencyP99Milliseconds"] = .real(latencyP99Milliseconds) }
        d["slowRequestsPer1000"] = .real(slowRequestsPer1000)
        d["slowRequestSeconds"] = .real(slowRequestSeconds)
        d["interruptionsByReason"] = .dictionary(interruptionsByReason.mapValues { .integer(Int64($0)) })
        d["pools"] = .array(pools.map { p in
            var e: [String: PlistValue] = ["state": .string(p.state.rawValue), "crashCount": .integer(Int64(p.crashCount)),
                                           "backoffSeconds": .real(p.backoffSeconds)]
            if let app = p.app { e["app"] = .string(app) }
            if let retry = p.retryInSeconds { e["retryInSeconds"] = .real(retry) }
            return .dictionary(e)
        })
        d["workers"] = .array(workers.map { w in
            var e: [String: PlistValue] = [
                "pid": .integer(Int64(w.pid)), "uptimeSeconds": .real(w.uptimeSeconds),
                "inFlight": .integer(Int64(w.inFlight)), "requestsServed": .integer(Int64(w.requestsServed)),
                "recycling": .bool(w.recycling), "sandbox": .array(w.sandbox.map(PlistValue.string)),
                "sandboxSkipped": .array(w.sandboxSkipped.map(PlistValue.string)),
            ]
            if let app = w.app { e["app"] = .string(app) }
            return .dictionary(e)
        })
        return .dictionary(d)
    }

    init(plist e: PlistValue) {
        func int(_ key: String) -> Int { Int(e[key]?.integerValue ?? 0) }
        func state(_ v: PlistValue?) -> SupervisionState { v?.stringValue.flatMap(SupervisionState.init(rawValue:)) ?? .running }
        let byReason = (e["interruptionsByReason"]?.dictionaryValue ?? [:]).mapValues { Int($0.integerValue ?? 0) }
        self.init(
            identifier: e["identifier"]?.stringValue ?? "?", state: state(e["state"]), crashCount: int("crashCount"),
            retryInSeconds: e["retryInSeconds"]?.doubleValue, requests: int("requests"), completions: int("completions"),
            cancellations: int("cancellations"), interruptions: int("interruptions"), interruptionsByReason: byReason,
            latencyP50Milliseconds: (e["latencyP50Milliseconds"] ?? e["latencyP50Ms"])?.doubleValue,
            latencyP99Milliseconds: (e["latencyP99Milliseconds"] ?? e["latencyP99Ms"])?.doubleValue,
            slowRequests: int("slowRequests"), slowRequestsPer1000: e["slowRequestsPer1000"]?.doubleValue ?? 0,
            slowRequestSeconds: e["slowRequestSeconds"]?.doubleValue ?? 0, crashes: int("crashes"), hangKills: int("hangKills"),
            timeouts: int("timeouts"), overloads: int("overloads"), protocolViolations: int("protocolViolations"),
            spawns: int("spawns"), recycles: int("recycles"), quarantines: int("quarantines"), leaks: int("leaks"),
            pools: (e["pools"]?.arrayValue ?? []).map { p in
                PoolStatus(app: p["app"]?.stringValue, state: state(p["state"]),
                           crashCount: Int(p["crashCount"]?.integerValue ?? 0), retryInSeconds: p["retryInSeconds"]?.doubleValue,
                           backoffSeconds: p["backoffSeconds"]?.doubleValue ?? 0)
            },
            workers: (e["workers"]?.arrayValue ?? []).map { w in
                WorkerStatus(pid: Int32(truncatingIfNeeded: w["pid"]?.integerValue ?? 0), app: w["app"]?.stringValue,
                             uptimeSeconds: w["uptimeSeconds"]?.doubleValue ?? 0,
                             inFlight: Int(w["inFlight"]?.integerValue ?? 0),
                             requestsServed: Int(w["requestsServed"]?.integerValue ?? 0),
                             recycling: w["recycling"]?.boolValue ?? false,
                             sandbox: (w["sandbox"]?.arrayValue ?? []).compactMap(\.stringValue),
                             sandboxSkipped: (w["sandboxSkipped"]?.arrayValue ?? []).compactMap(\.stringValue))
            })
    }
}
