// HostStatus: what `sdk-host status` shows, as public values, and the one status model from the engine to the
// screen. The engine builds it on its loop (`statusOnLoop`); an embedded host hands it to the app as it is; the
// daemon filters it for the asking client and sends it as the plist its Codable form encodes to
// (`statusReport`); the client library decodes that plist back; `sdk-host status --json` prints the same plist
// as JSON, which Foundation's JSONDecoder reads back into a HostStatus (the tests do). The plist is written out
// field by field for speed, and a test holds it to exactly what the Codable form encodes to; the crash and leak
// reports have hand-written forms of their own, which are also their files on disk.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix

/// A host's status: its extensions, their workers and what their requests did.
public struct HostStatus: Sendable, Equatable, Codable {
    /// The host's pid (the daemon's, or the app's for an embedded host).
    public var pid: Int32
    public var uptimeSeconds: Double
    /// Requests begun and not ended, and how many of them wait for a worker.
    public var activeRequests: Int
    public var queuedRequests: Int
    /// The extensions' counters added up.
    public var totals: StatusTotals
    /// One entry per extension that has had a request or a worker, sorted by identifier.
    public var extensions: [ExtensionStatus]
    /// The newest crash reports (at most 8, oldest first; each stderr tail cut to its last 2 KiB).
    public var recentCrashes: [CrashReport] = []
    /// The newest leak reports (at most 32, oldest first).
    public var recentLeaks: [LeakReport] = []
}

/// Whether an extension (or one app's pool of it) may start workers.
public enum SupervisionState: String, Sendable, Equatable, Codable {
    /// Healthy.
    case running
    /// Its workers kept dying on their own: requests end at once as `quarantined` until the backoff passes.
    case quarantined
    /// The backoff has passed; the next success clears it, the next death quarantines it for twice as long.
    case probation
}

/// Every extension's counters added up (`HostStatus.totals`); each is the `ExtensionStatus` field of its name.
public struct StatusTotals: Sendable, Equatable, Codable {
    public var requests = 0
    public var completions = 0
    public var cancellations = 0
    public var interruptions = 0
    public var slowRequests = 0
    public var crashes = 0
    public var hangKills = 0
    public var timeouts = 0
    public var overloads = 0
    public var protocolViolations = 0
    public var spawns = 0
    public var recycles = 0
    public var quarantines = 0
    public var leaks = 0

    /// The sums of `extensions`' counters.
    public init(adding extensions: [ExtensionStatus]) {
        for e in extensions {
            requests += e.requests
            completions += e.completions
            cancellations += e.cancellations
            interruptions += e.interruptions
            slowRequests += e.slowRequests
            crashes += e.crashes
            hangKills += e.hangKills
            timeouts += e.timeouts
            overloads += e.overloads
            protocolViolations += e.protocolViolations
            spawns += e.spawns
            recycles += e.recycles
            quarantines += e.quarantines
            leaks += e.leaks
        }
    }
}

/// One extension's figures since the host started.
public struct ExtensionStatus: Sendable, Equatable, Codable {
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
    /// Why no request of it can start (its manifest's error, a refusal, an executable not found: what
    /// `ExtensionHost.extension(identifier:)` throws for it), or nil when it can run.
    public var problem: String? = nil
}

/// One pool of an extension's workers.
public struct PoolStatus: Sendable, Equatable, Codable {
    /// The daemon client app it serves ("uid/name"), or nil for the extension's own (shared or warm) pool.
    public var app: String?
    public var state: SupervisionState
    public var crashCount: Int
    public var retryInSeconds: Double?
    /// The length of its current or last quarantine, in seconds (0 when healthy).
    public var backoffSeconds: Double
}

/// One live worker.
public struct WorkerStatus: Sendable, Equatable, Codable {
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
    /// What each step of its launcher took, in µs, when the host measures them
    /// (`HostConfiguration.measuresSandboxLayers`); empty otherwise.
    public var sandboxMicroseconds: [String: Int] = [:]
}

extension HostEngine {
    /// The status, read on the loop.
    package func statusOnLoop() -> HostStatus {
        let now = loop.now
        // Every installed extension, used or not, so an operator sees what could run.
        let ids = Set(manifests.keys).union(metrics.extensionIDs).union(workers.all.map { $0.extensionID }).union(supervisor.pools.values.map { $0.extensionID })
        let extensions = ids.sorted().map { id -> ExtensionStatus in
            let c = metrics.tallies[id]?.statistics ?? HostStatistics()
            let a = metrics.tallies[id]?.activity ?? ExtensionActivity()
            // Pools with a crash record, and pools that only have workers.
            let keys = Set(supervisor.pools.values.filter { $0.extensionID == id }.map { $0.key })
                .union(workers.poolKeys(of: id))
            let poolStates = keys.sorted().map { key in
                let p = supervisor.pools[key] ?? PoolState(key: key, extensionID: id, app: workers[key].first?.app, restartWindow: 0)
                let health = p.health(now: now)
                return PoolStatus(
                    app: p.app, state: SupervisionState(rawValue: health.rawValue) ?? .running,
                    crashCount: p.recentDeathCount(now: now),
                    retryInSeconds: health == .quarantined ? Double((p.quarantinedUntil ?? now) &- now) / 1e9 : nil,
                    backoffSeconds: p.backoff)
            }
            let state: SupervisionState = poolStates.contains { $0.state == .quarantined } ? .quarantined
                : poolStates.contains { $0.state == .probation } ? .probation : .running
            let workerStates = workers.all.filter { $0.extensionID == id }.map { w in
                WorkerStatus(pid: w.pid, app: w.app, uptimeSeconds: Double(now &- w.startedAt) / 1e9,
                             inFlight: w.inFlight.count, requestsServed: w.requestsSent, recycling: w.lifecycle.recycleReason != nil,
                             sandbox: w.sandboxLayers, sandboxSkipped: w.sandboxSkipped,
                             sandboxMicroseconds: w.sandboxMicroseconds)
            }.sorted { $0.pid < $1.pid }
            return ExtensionStatus(
                identifier: id, state: state, crashCount: poolStates.map { $0.crashCount }.max() ?? 0,
                retryInSeconds: poolStates.compactMap { $0.retryInSeconds }.min(),
                requests: c.requests, completions: c.completions, cancellations: c.cancellations,
                interruptions: c.interruptions, interruptionsByReason: a.interruptionsByKind,
                latencyP50Milliseconds: a.latency.percentile(0.5).map { $0 * 1000 },
                latencyP99Milliseconds: a.latency.percentile(0.99).map { $0 * 1000 },
                slowRequests: a.slowRequests, slowRequestsPer1000: c.requests > 0 ? Double(a.slowRequests) * 1000 / Double(c.requests) : 0,
                slowRequestSeconds: Double(a.slowNanoseconds) / 1e9, crashes: c.crashes, hangKills: c.hangKills,
                timeouts: c.timeouts, overloads: c.overloads, protocolViolations: c.protocolViolations,
                spawns: c.spawns, recycles: a.recycles, quarantines: a.quarantines, leaks: c.leaks, pools: poolStates,
                workers: workerStates, problem: manifests[id] == nil ? nil : lookupProblem(id)?.detail)
        }
        let crashes = metrics.crashReports.suffix(8).map { report in
            var report = report
            report.stderrTail = String(decoding: Array(report.stderrTail.utf8.suffix(2048)), as: UTF8.self)
            return report
        }
        return HostStatus(pid: getpid(), uptimeSeconds: Double(monotonicNanoseconds() &- startedAt) / 1e9,
                          activeRequests: requests.count,
                          queuedRequests: requests.queuedCount,
                          totals: StatusTotals(adding: extensions), extensions: extensions,
                          recentCrashes: Array(crashes), recentLeaks: metrics.recentLeaks)
    }
}

// MARK: Reading another version's status

extension HostStatus {
    /// Reads what any daemon of this protocol version writes: a crash or leak report that does not read is
    /// skipped, not the whole status.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        pid = try c.decode(Int32.self, forKey: .pid)
        uptimeSeconds = try c.decode(Double.self, forKey: .uptimeSeconds)
        activeRequests = try c.decode(Int.self, forKey: .activeRequests)
        queuedRequests = try c.decode(Int.self, forKey: .queuedRequests)
        totals = try c.decode(StatusTotals.self, forKey: .totals)
        extensions = try c.decode([ExtensionStatus].self, forKey: .extensions)
        recentCrashes = (try c.decodeIfPresent([Skippable<CrashReport>].self, forKey: .recentCrashes) ?? []).compactMap { $0.value }
        recentLeaks = (try c.decodeIfPresent([Skippable<LeakReport>].self, forKey: .recentLeaks) ?? []).compactMap { $0.value }
    }
}

extension WorkerStatus {
    /// `sandboxMicroseconds` is newer than the rest: a daemon that does not send it is read with none.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        pid = try c.decode(Int32.self, forKey: .pid)
        app = try c.decodeIfPresent(String.self, forKey: .app)
        uptimeSeconds = try c.decode(Double.self, forKey: .uptimeSeconds)
        inFlight = try c.decode(Int.self, forKey: .inFlight)
        requestsServed = try c.decode(Int.self, forKey: .requestsServed)
        recycling = try c.decode(Bool.self, forKey: .recycling)
        sandbox = try c.decode([String].self, forKey: .sandbox)
        sandboxSkipped = try c.decode([String].self, forKey: .sandboxSkipped)
        sandboxMicroseconds = try c.decodeIfPresent([String: Int].self, forKey: .sandboxMicroseconds) ?? [:]
    }
}

/// An element of an array that is dropped, not fatal, when it does not decode.
private struct Skippable<Value: Decodable>: Decodable {
    let value: Value?
    init(from decoder: any Decoder) throws { value = try? Value(from: decoder) }
}

// MARK: The plist form (status --json prints it as JSON)

extension HostStatus {
    /// The `statusReport` plist: the Codable form (what `PlistValueEncoder` makes of it, which `HostStatusTests`
    /// checks field for field); `sdk-host status --json` prints it as JSON. Written out here because the daemon
    /// builds one per `status` asked for, and Codable's keyed containers cost about 1,500 instructions a field:
    /// the whole status took ~0.5 M. The crash and leak reports, at most 40 and their files' form, still go through
    /// Codable.
    public var plist: PlistValue {
        .dictionary([
            "pid": .integer(Int64(pid)), "uptimeSeconds": .real(uptimeSeconds),
            "activeRequests": .integer(Int64(activeRequests)), "queuedRequests": .integer(Int64(queuedRequests)),
            "totals": totals.plist, "extensions": .array(extensions.map { $0.plist }),
            "recentCrashes": .array(recentCrashes.map { $0.codablePlist }), "recentLeaks": .array(recentLeaks.map { $0.codablePlist }),
        ])
    }

    /// Reads a `statusReport` plist.
    ///
    /// - Throws: `DecodingError` naming the field that is missing or of the wrong kind.
    public init(plist: PlistValue) throws {
        self = try PlistValueDecoder().decode(HostStatus.self, from: plist)
    }
}

extension StatusTotals {
    var plist: PlistValue {
        .dictionary([
            "requests": .int(requests), "completions": .int(completions), "cancellations": .int(cancellations),
            "interruptions": .int(interruptions), "slowRequests": .int(slowRequests), "crashes": .int(crashes),
            "hangKills": .int(hangKills), "timeouts": .int(timeouts), "overloads": .int(overloads),
            "protocolViolations": .int(protocolViolations), "spawns": .int(spawns), "recycles": .int(recycles),
            "quarantines": .int(quarantines), "leaks": .int(leaks),
        ])
    }
}

extension ExtensionStatus {
    var plist: PlistValue {
        var d: [String: PlistValue] = [
            "identifier": .string(identifier), "state": .string(state.rawValue), "crashCount": .int(crashCount),
            "requests": .int(requests), "completions": .int(completions), "cancellations": .int(cancellations),
            "interruptions": .int(interruptions), "interruptionsByReason": .dictionary(interruptionsByReason.mapValues(PlistValue.int)),
            "slowRequests": .int(slowRequests), "slowRequestsPer1000": .real(slowRequestsPer1000),
            "slowRequestSeconds": .real(slowRequestSeconds), "crashes": .int(crashes), "hangKills": .int(hangKills),
            "timeouts": .int(timeouts), "overloads": .int(overloads), "protocolViolations": .int(protocolViolations),
            "spawns": .int(spawns), "recycles": .int(recycles), "quarantines": .int(quarantines), "leaks": .int(leaks),
            "pools": .array(pools.map { $0.plist }), "workers": .array(workers.map { $0.plist }),
        ]
        if let retryInSeconds { d["retryInSeconds"] = .real(retryInSeconds) }
        if let latencyP50Milliseconds { d["latencyP50Milliseconds"] = .real(latencyP50Milliseconds) }
        if let latencyP99Milliseconds { d["latencyP99Milliseconds"] = .real(latencyP99Milliseconds) }
        if let problem { d["problem"] = .string(problem) }
        return .dictionary(d)
    }
}

extension PoolStatus {
    var plist: PlistValue {
        var d: [String: PlistValue] = ["state": .string(state.rawValue), "crashCount": .int(crashCount), "backoffSeconds": .real(backoffSeconds)]
        if let app { d["app"] = .string(app) }
        if let retryInSeconds { d["retryInSeconds"] = .real(retryInSeconds) }
        return .dictionary(d)
    }
}

extension WorkerStatus {
    var plist: PlistValue {
        var d: [String: PlistValue] = [
            "pid": .integer(Int64(pid)), "uptimeSeconds": .real(uptimeSeconds), "inFlight": .int(inFlight),
            "requestsServed": .int(requestsServed), "recycling": .bool(recycling),
            "sandbox": .array(sandbox.map(PlistValue.string)), "sandboxSkipped": .array(sandboxSkipped.map(PlistValue.string)),
            "sandboxMicroseconds": .dictionary(sandboxMicroseconds.mapValues(PlistValue.int)),
        ]
        if let app { d["app"] = .string(app) }
        return .dictionary(d)
    }
}

private extension PlistValue {
    static func int(_ value: Int) -> PlistValue { .integer(Int64(value)) }
}
