// Supervision (shared/DESIGN.md "Supervision and isolation"): crash-loop quarantine,
// warm workers, recycling, the pools that keep one daemon client app's workers its own, and workers' leak reports.
//
// A pool is the set of workers that may serve a request: one per extension in an embedded host and for a
// `shared` extension, one per (extension, app) for a `perApp` extension in the daemon. Quarantine is per pool, so
// one app's crash-inducing input can quarantine only that app. Warm workers live in the extension's base pool;
// an app pool with no worker adopts one that has never served a request, so a spare carries no other app's data.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix

extension HostEngine {
    /// The pool a request of `app` for `manifest` goes to.
    func poolKey(_ manifest: ExtensionManifest?, app: String?) -> String {
        guard let manifest else { return "" }
        guard let app, manifest.policy.workerSharing == .perApp else { return manifest.identifier }
        if let last = lastPoolKey, last.app == app, last.extensionID == manifest.identifier { return last.key }
        let key = manifest.identifier + "\u{1F}" + app
        lastPoolKey = (manifest.identifier, app, key)
        return key
    }

    // MARK: Quarantine

    /// Ends `record` as `quarantined` if its pool is; true if it did.
    func endIfQuarantined(_ record: RequestRecord) -> Bool {
        guard supervisor.isQuarantined(record.poolKey, now: loop.now) else { return false }
        finish(record.id, .interrupted(.quarantined))
        return true
    }

    /// A worker of `pool` died on its own (not killed for a cancel, a deadline or shutdown). Past the restart
    /// limit, or once in probation after a quarantine, the pool is quarantined and what waits for it ends.
    func workerDiedOnItsOwn(_ worker: WorkerProcess) {
        let policy = worker.policy
        let state = supervisor.state(worker.poolKey, extensionID: worker.extensionID, app: worker.app,
                                     restartWindow: nanoseconds(policy.restartLimitIntervalSeconds))
        guard supervisor.diedOnItsOwn(state, restartLimitBurst: policy.restartLimitBurst,
                                      firstQuarantine: policy.quarantineSeconds, now: loop.now)
        else { return }
        metrics.tally(worker.extensionID).activity.quarantines += 1
        log(.warning, "\(worker.extensionID)\(worker.app.map { " (app \($0))" } ?? ""): \(state.recentDeaths.count) "
            + "worker(s) died on their own within \(policy.restartLimitIntervalSeconds) s; quarantined for \(state.backoff) s")
        emit(.quarantined, worker, detail: "\(state.recentDeaths.count) death(s) within \(policy.restartLimitIntervalSeconds) s; for \(state.backoff) s")
        if let timer = state.retryTimer { loop.cancelTimer(timer) }
        state.retryTimer = loop.schedule(afterNanoseconds: nanoseconds(state.backoff)) { [unowned self, weak state] in
            guard let state else { return }
            state.retryTimer = nil
            self.log(.info, "\(state.extensionID): quarantine over; the next request may start a worker")
            if let manifest = self.manifests[state.extensionID], state.app == nil { self.topUpWarmWorkers(manifest) }
        }
        for record in requests.dequeueAll(in: worker.poolKey) { finish(record.id, .interrupted(.quarantined)) }
    }

    /// A request of `key` completed: after a quarantine's backoff, that clears it.
    func poolSucceeded(_ key: String) {
        guard let state = supervisor.succeeded(key, now: loop.now) else { return }
        log(.info, "\(state.extensionID)\(state.app.map { " (app \($0))" } ?? ""): a request completed after the "
            + "quarantine; healthy again")
    }

    /// Forgets pools that have no worker, nothing waiting, and no crash record that still matters, so app
    /// names that come and go leave nothing behind. Runs with the heartbeat.
    func prunePools() {
        supervisor.prune(now: loop.now) { key in !workers.hasWorkers(in: key) && requests.queuedCount(in: key) == 0 }
    }

    // MARK: Warm workers

    /// Starts workers in `manifest`'s base pool until `MinWarmWorkers` are live (not while it is quarantined
    /// or the host is stopping).
    func topUpWarmWorkers(_ manifest: ExtensionManifest) {
        let target = manifest.policy.minWarmWorkers
        guard target > 0, !shuttingDown, manifest.executablePath != nil, manifest.refusal == nil else { return }
        let key = manifest.identifier
        if supervisor.isQuarantined(key, now: loop.now) { return }
        guard loop.onLoopThread else {
            loop.execute { [unowned self] in self.topUpWarmWorkers(manifest) }
            return
        }
        var live = workers.liveCount(in: key)
        while live < target, capacityAllows(pool: key, app: nil) {
            do {
                _ = try spawnWorker(manifest, poolKey: key, app: nil)
            } catch {
                log(.error, "\(key): cannot start a warm worker: \(error)")
                return
            }
            live += 1
        }
    }

    /// A worker of the base pool that has never served a request, moved into the app pool `key`.
    func adoptSpare(_ manifest: ExtensionManifest, into key: String, app: String?) -> WorkerProcess? {
        let base = manifest.identifier
        guard key != base, let worker = workers[base].first(where: {
            $0.requestsSent == 0 && $0.inFlight.isEmpty && $0.acceptsRequests
        }) else { return nil }
        workers.move(worker, to: key)
        worker.app = app
        if let timer = worker.idleTimer {
            loop.cancelTimer(timer)
            worker.idleTimer = nil
        }
        log(.info, "\(base): warm worker pid \(worker.pid) now serves app \(app ?? "?")")
        topUpWarmWorkers(manifest)
        return worker
    }

    /// Whether an idle worker may be retired: not if that would leave its base pool below `MinWarmWorkers`.
    func mayRetireIdle(_ worker: WorkerProcess) -> Bool {
        guard worker.poolKey == worker.extensionID, worker.policy.minWarmWorkers > 0 else { return true }
        return workers.liveCount(in: worker.poolKey) > worker.policy.minWarmWorkers
    }

    /// Starts (or finds) a handshaken worker for `extensionID`'s pool of `app`, and tells `done` its pid, or why
    /// there is none.
    package func prewarmOnLoop(_ extensionID: String, app: String?,
                               done: @escaping @Sendable (Result<pid_t, RequestFailure>) -> Void)
    {
        guard let manifest = manifests[extensionID] else {
            return done(.failure(.interrupted(.launchFailed("unknown extension \(extensionID)"))))
        }
        if shuttingDown { return done(.failure(.interrupted(.hostShutdown))) }
        let key = poolKey(manifest, app: app)
        if supervisor.isQuarantined(key, now: loop.now) { return done(.failure(.interrupted(.quarantined))) }
        let pool = workers[key]
        if let ready = pool.first(where: { $0.lifecycle.phase == .ready && $0.acceptsRequests }) { return done(.success(ready.pid)) }
        let worker: WorkerProcess
        if let starting = pool.first(where: { $0.lifecycle.phase == .starting && $0.acceptsRequests }) {
            worker = starting
        } else if let spare = adoptSpare(manifest, into: key, app: app) {
            if spare.lifecycle.phase == .ready { return done(.success(spare.pid)) }
            worker = spare
        } else if workers.liveCount(in: key) < manifest.policy.maxWorkers {
            guard capacityAllows(pool: key, app: app) else { return done(.failure(.interrupted(.overloaded))) }
            guard loop.onLoopThread else {
                // Run only while the loop accepts tasks, and so while the engine is alive; a stopped loop's
                // refusal answers below.
                let queued = loop.execute { [unowned self] in
                    self.prewarmOnLoop(extensionID, app: app, done: done)
                }
                if !queued { done(.failure(.interrupted(.hostShutdown))) }
                return
            }
            do {
                worker = try spawnWorker(manifest, poolKey: key, app: app)
            } catch {
                return done(.failure(.interrupted(.launchFailed(error.description))))
            }
        } else {
            // The pool is full and every worker is busy: they are all started.
            return done(.success(pool.first?.pid ?? 0))
        }
        worker.readyWaiters.append(done)
    }

    // MARK: Recycling

    /// Retires a worker past `MaxRequestsPerWorker` or `MaxWorkerRSSMB` once it has nothing in flight.
    func recycleIfDrained(_ worker: WorkerProcess) {
        guard worker.lifecycle.phase == .draining, worker.inFlight.isEmpty else { return }
        metrics.tally(worker.extensionID).activity.recycles += 1
        log(.info, "\(worker.extensionID): recycling worker pid \(worker.pid) after \(worker.requestsSent) request(s)"
            + (worker.lifecycle.recycleReason.map { " (\($0))" } ?? ""))
        emit(.recycled, worker, detail: worker.lifecycle.recycleReason)
        retire(worker, grace: max(configuration.workerExitGracePeriodSeconds, 2), because: "recycled and drained")
    }

    /// Marks workers whose resident memory is past `MaxWorkerRSSMB` for recycling (heartbeat).
    func checkResidentMemory(_ worker: WorkerProcess) {
        guard let limit = worker.policy.maxWorkerRSSMB, worker.lifecycle.phase == .ready,
            let rss = residentBytes(worker.pid), rss > UInt64(limit) << 20,
            worker.lifecycle.recycle("resident memory \(rss >> 20) MiB > MaxWorkerRSSMB \(limit)")
        else { return }
        recycleIfDrained(worker)
        drainWaiting(worker.poolKey)
    }
}

/// A process's resident set size, from /proc/<pid>/statm.
func residentBytes(_ pid: pid_t) -> UInt64? {
    guard let bytes = try? readFile("/proc/\(pid)/statm") else { return nil }
    let fields = String(decoding: bytes, as: UTF8.self).split(separator: " ")
    guard fields.count > 1, let pages = UInt64(fields[1]) else { return nil }
    return pages * UInt64(sysconf(Int32(_SC_PAGESIZE)))
}

// MARK: Leak reports

extension HostEngine {
    /// A worker says request `id` ended `afterMs` ago and `alive` still lives. Counted at most once per request
    /// the worker was sent (a lying worker can inflate its own count no further), never for one in flight;
    /// logged (the first few per worker, then every hundredth) and, in the daemon, written beside crash reports.
    func leakReported(_ id: RequestID, alive: [String], afterMs: Int64, by worker: WorkerProcess) {
        // A worker told to make no leak checks (LeakCheckDelaySeconds 0: SDKHOST_LEAK_CHECK_MS=0) has none to report.
        guard Int64(worker.policy.leakCheckDelaySeconds * 1000) > 0, !worker.inFlight.contains(id),
            worker.leaksReported < worker.requestsSent
        else {
            log(.debug, "\(worker.extensionID) pid \(worker.pid): leak report for \(id) ignored")
            return
        }
        worker.leaksReported += 1
        count(worker.extensionID, \.leaks)
        // The worker's words: at most four short names, escaped for the log, cut for the report.
        let alive = alive.prefix(4).map { String(decoding: Array($0.utf8.prefix(32)), as: UTF8.self) }
        let what = alive.map { OutputLines.escape(Array($0.utf8)) }.joined(separator: " and ")
        if worker.leaksReported <= 8 || worker.leaksReported % 100 == 0 {
            log(.warning, "\(worker.extensionID) pid \(worker.pid): leak: request \(id) ended \(Double(afterMs) / 1000) s ago "
                + "and its \(what) is still alive (\(worker.leaksReported) leak(s) from this worker)")
        }
        if worker.leaksReported <= 8 {
            var report = LeakReport(extensionIdentifier: worker.extensionID, pid: worker.pid, requestID: id, alive: alive,
                                    afterMilliseconds: afterMs, time: timespec.now.seconds)
            report.app = worker.app
            crashStore?.saveLeak(report)
            metrics.addLeak(report)
        }
    }
}
