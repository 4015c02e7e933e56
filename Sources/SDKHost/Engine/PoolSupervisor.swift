// PoolSupervisor: the engine's supervision job, crash-loop quarantine per pool (shared/DESIGN.md "Supervision
// and isolation"). Each pool keeps when its workers died on their own; at the `RestartLimitBurst`th death within
// `RestartLimitIntervalSeconds` it is quarantined for `QuarantineSeconds`, then on probation: the next success
// clears it, the next death quarantines it for twice as long, up to `maximumQuarantine`. Loop-confined. It only
// decides; the engine ends the requests, logs, and runs the retry timer (HostEngine+Supervision.swift).
// PoolSupervisorTests pin the rules.
import SDKPosix

/// Crash-loop state of one pool. Loop-confined.
final class PoolState {
    // Stored properties `@exclusivity(unchecked)`: see RequestTable.
    let key: String
    let extensionID: String
    /// The app (uid plus name) this pool serves; nil for the extension's base pool.
    let app: String?
    /// `RestartLimitIntervalSeconds` of its extension, in nanoseconds.
    let restartWindow: UInt64
    /// When its workers died on their own, within the restart window (oldest first).
    @exclusivity(unchecked) var recentDeaths: [UInt64] = []
    /// Workers of this pool that died on their own, ever.
    @exclusivity(unchecked) var deaths = 0
    /// While set and in the future, new requests end at once as `quarantined`.
    @exclusivity(unchecked) var quarantinedUntil: UInt64?
    /// The backoff of the last quarantine, in seconds; 0 once a request has succeeded after it.
    @exclusivity(unchecked) var backoff: Double = 0
    @exclusivity(unchecked) var quarantines = 0
    @exclusivity(unchecked) var retryTimer: TimerID?

    init(key: String, extensionID: String, app: String?, restartWindow: UInt64) {
        self.key = key
        self.extensionID = extensionID
        self.app = app
        self.restartWindow = restartWindow
    }

    /// Deaths on their own within the restart window.
    func recentDeathCount(now: UInt64) -> Int { recentDeaths.filter { now &- $0 <= restartWindow }.count }

    enum Health: String { case running, quarantined, probation }

    func health(now: UInt64) -> Health {
        if let until = quarantinedUntil, until > now { return .quarantined }
        return backoff > 0 ? .probation : .running
    }
}

/// Every pool's crash record. Loop-confined.
final class PoolSupervisor {
    // Stored properties `@exclusivity(unchecked)`: see RequestTable.
    @exclusivity(unchecked) private(set) var pools: [String: PoolState] = [:]

    /// Pool `key`'s state, made on first use.
    func state(_ key: String, extensionID: String, app: String?, restartWindow: UInt64) -> PoolState {
        if let state = pools[key] { return state }
        let state = PoolState(key: key, extensionID: extensionID, app: key == extensionID ? nil : app,
                              restartWindow: restartWindow)
        pools[key] = state
        return state
    }

    /// Whether requests for pool `key` end at once as `quarantined`.
    func isQuarantined(_ key: String, now: UInt64) -> Bool {
        guard let until = pools[key]?.quarantinedUntil else { return false }
        return until > now
    }

    /// A worker of `state`'s pool died on its own (not killed for a cancel, a deadline or shutdown). Returns
    /// whether that quarantines the pool: the `restartLimitBurst`th death within the window, or any death on
    /// probation. The quarantine lasts `firstQuarantine` seconds, then twice the last one, up to
    /// `maximumQuarantine`.
    func diedOnItsOwn(_ state: PoolState, restartLimitBurst: Int, firstQuarantine: Double, now: UInt64) -> Bool {
        state.deaths += 1
        state.recentDeaths.append(now)
        state.recentDeaths.removeAll { now &- $0 > state.restartWindow }
        if state.recentDeaths.count > restartLimitBurst { state.recentDeaths.removeFirst() }
        let inProbation = state.backoff > 0 && state.health(now: now) == .probation
        guard inProbation || state.recentDeaths.count >= restartLimitBurst else { return false }
        state.backoff = state.backoff > 0 ? min(state.backoff * 2, maximumQuarantine) : firstQuarantine
        state.quarantinedUntil = now &+ nanoseconds(state.backoff)
        state.quarantines += 1
        return true
    }

    /// A request of pool `key` completed: on probation, that clears the pool's record. Returns the pool if it
    /// did.
    func succeeded(_ key: String, now: UInt64) -> PoolState? {
        guard let state = pools[key], state.backoff > 0, state.health(now: now) == .probation else { return nil }
        state.backoff = 0
        state.recentDeaths.removeAll()
        return state
    }

    /// Forgets the pools `idle` says have no worker and nothing waiting, whose record no longer matters (no
    /// recent death, no probation that could still quarantine, no retry timer), so that app names that come and
    /// go leave nothing behind.
    func prune(now: UInt64, idle: (String) -> Bool) {
        for (key, state) in pools where state.retryTimer == nil && idle(key) {
            let recent = state.recentDeathCount(now: now) > 0
            let probationOver = state.backoff == 0
                || (state.quarantinedUntil.map { now &- $0 > nanoseconds(maximumQuarantine) } ?? true)
            if !recent && probationOver { pools[key] = nil }
        }
    }
}

/// Longest quarantine, in seconds (Kubernetes' CrashLoopBackOff cap).
let maximumQuarantine: Double = 300
