// Worker lifecycle events (for `ExtensionHost.workerEvents()` and the daemon's subscribers) and the SIGHUP
// rescan of manifests: new workers use the new manifests, running ones finish and retire.
import SDKWire
#if canImport(Glibc)
import Glibc
#endif

extension HostEngine {
    /// The worker's pid is settled: its `spawned` event goes out, and the requests it already has learn the pid
    /// (`pid(for:)`, `onWorkerAssigned`). A worker spawned through the launcher settles when the launcher's
    /// `sandboxed` frame names its own pid (in its own pid namespace it is the launcher's child), or at the first
    /// of its handshake, a launch failure or its exit; so every event and every pid of one worker is one pid.
    func settlePid(_ worker: WorkerProcess) {
        guard !worker.pidKnown else { return }
        worker.pidKnown = true
        emit(.spawned, worker)
        for id in worker.inFlight {
            if let record = requests[id] { publishPid(of: record, worker.pid) }
        }
    }

    func publishPid(of record: RequestRecord, _ pid: pid_t) {
        if record.publishesPid { pids.withLock { $0[record.id] = pid } }
        record.onWorkerAssigned?(pid)
    }

    /// Tells event streams and the observer that `kind` happened to `worker`.
    func emit(_ kind: WorkerEvent.Kind, _ worker: WorkerProcess, reason: InterruptionReason? = nil, detail: String? = nil) {
        guard eventObserver != nil || events.hasSubscribers else { return }
        let event = WorkerEvent(kind: kind, extensionIdentifier: worker.extensionID, pid: worker.pid, app: worker.app,
                                reason: reason, detail: detail)
        events.publish(event)
        eventObserver?(event)
    }

    // MARK: Reload

    /// How a log line about a manifest that discovery skipped ends (the CLI's `doctor` and `request` pick them out).
    package static let skippedManifestSuffix = "; skipped, the other extensions are served"

    /// Logs each manifest discovery skipped, and, at start, a launcher that is missing while extensions need it:
    /// once, not at each of their requests.
    func logSkippedManifests(_ problems: [HostError], during phase: String = "") {
        for problem in problems { log(.error, "\(phase)\(problem.detail)\(Self.skippedManifestSuffix)") }
        guard phase.isEmpty, launcherPath == nil else { return }
        let confined = manifests.values.filter { $0.refusal == nil && $0.policy.sandbox != .none }.map(\.identifier).sorted()
        if !confined.isEmpty {
            log(.error, "\(launcherExecutableName) not found next to the host executable or in the executable search "
                + "paths: \(confined.joined(separator: ", ")) cannot start (their requests end 'launch failed')")
        }
    }

    /// Reads the manifests again (SIGHUP). New workers use the new manifests; running ones finish what they have
    /// and are retired. Returns the identifiers now served, or the error that left the old manifests in place.
    package func reloadManifestsOnLoop() -> Result<[String], HostError> {
        loop.preconditionInLoop()
        let fresh: [String: ExtensionManifest]
        do {
            let (found, problems) = try ExtensionManifest.discover(in: configuration)
            logSkippedManifests(problems, during: "reload: ")
            fresh = found
        } catch {
            log(.error, "reload: \(error); keeping the \(manifests.count) manifest(s) in use")
            return .failure(error)
        }
        let before = Set(manifests.keys)
        manifests = fresh
        manifestSnapshot.withLock { $0 = fresh }
        workerEnvironments = workerEnvironments.filter { fresh[$0.key] != nil }
        for worker in workers.all where worker.lifecycle.recycle("manifests reloaded") {
            recycleIfDrained(worker)
        }
        let added = Set(fresh.keys).subtracting(before).sorted(), removed = before.subtracting(fresh.keys).sorted()
        log(.info, "reload: \(fresh.count) extension(s)"
            + (added.isEmpty ? "" : "; added \(added.joined(separator: ", "))")
            + (removed.isEmpty ? "" : "; removed \(removed.joined(separator: ", "))"))
        // Requests waiting for an extension that is gone end now rather than waiting for a worker that cannot come.
        for key in requests.queuedPools where requests.firstQueued(in: key).map({ fresh[$0.extensionID] == nil }) == true {
            for record in requests.dequeueAll(in: key) {
                finish(record.id, .interrupted(.launchFailed("\(record.extensionID) was removed by a manifest reload")))
            }
        }
        for manifest in fresh.values.sorted(by: { $0.identifier < $1.identifier }) { topUpWarmWorkers(manifest) }
        return .success(fresh.keys.sorted())
    }
}
