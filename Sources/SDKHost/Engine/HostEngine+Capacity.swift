// Worker caps across pools (shared/DESIGN.md "The daemon isolates uids and apps"). MaxWorkers bounds one pool;
// these bound them all: `maxWorkersTotal` processes in all, and, for the daemon's apps ("uid/name"),
// `maxWorkersPerUID` processes and `maxAppPoolsPerUID` pools per uid, so that forty app names of one user cannot
// make forty pools of workers. A worker counts until its process is gone, retiring or not.
//
// At a cap a request waits in its pool's queue (bounded by MaxQueuedRequests, ended by its deadline) and one
// idle worker in the way is retired, a worker of a pool with nothing in flight first; its exit lets the waiting
// requests try again. A worker that becomes idle while requests wait for room is retired the same way. An app
// whose last connection leaves has its workers retired soon after they are idle (`appLeft`), not after the
// idle timeout.

extension HostEngine {
    /// The uid part of a daemon app ("uid/name"); nil for a shared pool or an embedded host's requests.
    static func uid(ofApp app: String?) -> Substring? {
        guard let app, let slash = app.firstIndex(of: "/") else { return nil }
        return app[..<slash]
    }

    /// Whether a new worker for pool `key` (of `app`) fits under the caps. When it does not, an idle worker in
    /// the way is retired (unless one is already on its way out) and the caller's request waits.
    func capacityAllows(pool key: String, app: String?) -> Bool {
        // One pass, counting (asked before every spawn); the workers in the way are listed only when a cap is hit.
        let uid = Self.uid(ofApp: app)
        var running = 0, ofUID = 0, listsPool = false
        var poolsOfUID: [String] = []
        for worker in workers.all where !worker.lifecycle.phase.isOver {
            running += 1
            guard let uid, Self.uid(ofApp: worker.app) == uid else { continue }
            ofUID += 1
            if worker.poolKey == key { listsPool = true }
            if !poolsOfUID.contains(worker.poolKey) { poolsOfUID.append(worker.poolKey) }
        }
        func inTheWay(ofUID only: Bool) -> [WorkerProcess] {
            workers.all.filter { !$0.lifecycle.phase.isOver && (!only || Self.uid(ofApp: $0.app) == uid) }
        }
        if running >= configuration.maxWorkersTotal {
            makeRoom(among: inTheWay(ofUID: false), limit: "MaxWorkersTotal \(configuration.maxWorkersTotal)")
            return false
        }
        guard uid != nil else { return true }
        if ofUID >= configuration.maxWorkersPerUID {
            makeRoom(among: inTheWay(ofUID: true), limit: "MaxWorkersPerUID \(configuration.maxWorkersPerUID)")
            return false
        }
        if !listsPool, poolsOfUID.count >= configuration.maxAppPoolsPerUID {
            makeRoom(among: inTheWay(ofUID: true), limit: "MaxAppPoolsPerUID \(configuration.maxAppPoolsPerUID)")
            return false
        }
        return true
    }

    /// Retires one idle worker among `candidates` (of a pool with nothing in flight first), unless one of them
    /// is already leaving; notes that requests wait for room.
    private func makeRoom(among candidates: [WorkerProcess], limit: String) {
        waitingForRoom = true
        guard !candidates.contains(where: { $0.lifecycle.retired && !$0.lifecycle.phase.isOver }) else { return }
        let idle = candidates.filter { $0.inFlight.isEmpty && $0.lifecycle.phase.isRunning }
        let busyPools = Set(candidates.filter { !$0.inFlight.isEmpty }.map { $0.poolKey })
        guard let victim = idle.first(where: { !busyPools.contains($0.poolKey) }) ?? idle.first else { return }
        log(.info, "\(victim.extensionID): retiring idle worker pid \(victim.pid)"
            + (victim.app.map { " of app \($0)" } ?? "") + " to make room (\(limit))")
        retire(victim, grace: 2, because: "retired to make room (\(limit))")
    }

    /// After a worker's exit, or a slot freed while requests wait for room: every waiting pool tries again.
    func retryWaitingForRoom() {
        guard waitingForRoom else { return }
        waitingForRoom = false
        for key in requests.queuedPools { drainWaiting(key) }
    }

    /// The daemon's app `app` has no connection left: its workers finish what they have (its requests were
    /// cancelled with its connections) and retire once idle for just long enough to report a leak of the last
    /// request (`LeakCheckDelaySeconds`, plus half a second), rather than after the idle timeout.
    package func appLeft(_ app: String) {
        loop.preconditionInLoop()
        for worker in workers.all where worker.app == app && !worker.lifecycle.phase.isOver {
            let idle = min(worker.policy.idleTimeoutSeconds, worker.policy.leakCheckDelaySeconds + 0.5)
            guard worker.idleTimeoutOverride == nil, idle < worker.policy.idleTimeoutSeconds else { continue }
            worker.idleTimeoutOverride = idle
            if let timer = worker.idleTimer {
                loop.cancelTimer(timer)
                worker.idleTimer = nil
                scheduleIdleRetirement(worker)
            }
        }
    }
}
