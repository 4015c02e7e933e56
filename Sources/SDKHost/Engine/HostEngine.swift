// HostEngine: requests, workers and their failures, all on one event-loop thread.
//
// Exactly-once: a request ends only through `finish`, which removes it from `requests` (and from its queue, its
// timer and its worker) before delivering its outcome. Every event (a reply, a worker exit, a deadline, a
// cancel, shutdown) runs on the loop thread, so whichever comes first wins and the others find no record: a late
// reply is dropped and logged. Delivery hops to the caller's queue, so no user code runs on the loop thread or
// under a lock. After delivery the engine holds nothing of the request: not its items, not its handlers.
//
// Bounded: at most `maxQueuedRequests` wait per extension (the rest end at once as `overloaded`); queues and
// timers are O(1) / O(log n) per operation; a deadline ends only its own request and cancels it at the worker,
// and the worker is killed only if it ignores the cancel past the grace period.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import Dispatch
import SDKPosix
import Synchronization

/// The engine. `@unchecked Sendable`: all mutable state is confined to `loop`'s turn (entry points hop to its
/// thread with `loop.execute`, or take the turn on the caller's thread with `loop.executeInline`; HostEngine+Backend),
/// except `pids`, which sits behind a Mutex for `pid(for:)`.
package final class HostEngine: @unchecked Sendable {
    package let loop: EventLoop
    let configuration: HostConfiguration
    /// The manifests in use (loop thread); a SIGHUP rescan (`reloadManifestsOnLoop`) replaces them.
    var manifests: [String: ExtensionManifest]
    /// The same manifests for other threads (`extension(identifier:)`, `extensions`).
    let manifestSnapshot: Mutex<[String: ExtensionManifest]>
    /// Worker lifecycle events for `ExtensionHost.workerEvents()`.
    let events = EventHub()
    /// Also told each event, on the loop (the daemon forwards them to subscribed clients).
    package var eventObserver: ((WorkerEvent) -> Void)?
    /// `HostConfiguration.forwardsPayloads`.
    var forwardsPayloads: Bool { configuration.forwardsPayloads }
    let crashStore: CrashReportStore?
    let launcher: any WorkerLauncher
    /// The sandbox launcher executable (nil: not found; only `Sandbox = none` extensions can run).
    let launcherPath: String?
    let pids = SpinningMutex<[RequestID: pid_t]>([:])
    /// When the engine started (monotonic), for `uptimeSeconds`.
    package let startedAt = monotonicNanoseconds()

    // Loop-confined state.
    /// Workers by pool, and those ended on their exit notice that wait to be reaped (WorkerTable.swift).
    let workers = WorkerTable<WorkerProcess>()
    /// Requests begun and not ended, and the queues of those waiting for a worker (RequestTable.swift).
    let requests = RequestTable()
    /// The empty network namespace this host's workers without NetworkAllowed share (a descriptor), -1 where it
    /// cannot be made, nil until the first spawn that needs it (`networkNamespaceForWorkers`).
    var sharedNetworkNamespace: Int32?
    /// The folder of device nodes workers' roots bind as /dev; "" where it cannot be made, nil until first needed.
    var deviceFolder: String?
    /// A root host's folder of root templates, once checked ("": none).
    var rootTemplates: String?
    /// A request waits for a worker cap to make room (HostEngine+Capacity).
    var waitingForRoom = false
    /// Each extension's worker environment and what it was made of (`workerEnvironment`).
    var workerEnvironments: [String: (inputs: WorkerEnvironmentInputs, environment: [String])] = [:]
    /// Each pool's crash record, quarantine and probation (PoolSupervisor.swift).
    let supervisor = PoolSupervisor()
    /// Counters, latencies, crash and leak reports, worker transitions (EngineMetrics.swift).
    let metrics = EngineMetrics()
    /// The last pool key made (extension, app, key): a daemon client's requests all ask for the same one, and
    /// building it joins two strings.
    var lastPoolKey: (extensionID: String, app: String?, key: String)?
    var readBuffer = [UInt8](uninitializedCount: 64 * 1024)
    var heartbeatTimer: TimerID?
    /// The uid and gid a root host's workers run as (`HostConfiguration.workerUser`), resolved once.
    let workerIdentity: WorkerIdentity
    /// Where workers' temp folders are made (`HostConfiguration.workerFolders`).
    let workerFolders: any WorkerFolders
    /// The private temp folder the next sandboxed worker gets, made ahead of its spawn (`makeSpareWorkerDirectory`).
    var spareWorkerDirectory: String?
    var shuttingDown = false
    var shutdownCompletions: [@Sendable () -> Void] = []
    /// Requests that have ended (cancelled, past their deadline) while a worker still runs them: it owes their
    /// answer, and keeps each in its `inFlight` until it answers or dies. Their ids are not free (`isInUse`).
    @exclusivity(unchecked) var endedButOwed: Set<RequestID> = []
    /// The engine itself, from the start of shutdown until its loop has stopped. Worker callbacks capture the
    /// engine unowned; an app may drop its host without awaiting shutdown, and the engine must outlive the
    /// reaping of its workers.
    private var keepAliveUntilStopped: HostEngine?

    package init(configuration: HostConfiguration) throws(HostError) {
        self.configuration = configuration
        let inputs: EngineStartInputs
        if let prepared = configuration.startInputs {
            inputs = prepared
        } else {
            inputs = try EngineStartInputs.read(configuration)
        }
        workerIdentity = inputs.workerIdentity
        launcher = configuration.launcher ?? PosixLauncher()
        workerFolders = configuration.workerFolders ?? FileSystemFolders()
        launcherPath = inputs.launcherPath
        manifests = inputs.manifests
        manifestSnapshot = Mutex(manifests)
        crashStore = try configuration.crashReportDirectory.map { directory throws(HostError) in
            try CrashReportStore(directory: directory, limit: configuration.crashReportLimit)
        }
        do {
            loop = try EventLoop(name: "sdk-host", clock: configuration.clock,
                                 busyPollMicroseconds: configuration.busyPollMicroseconds,
                                 driven: configuration.drivenLoop)
        } catch {
            throw HostError(.system, "cannot start the host event loop: \(error)")
        }
        logSkippedManifests(inputs.problems)
        prepareSandboxResources()
        if manifests.values.contains(where: { $0.policy.minWarmWorkers > 0 }) {
            loop.execute { [unowned self] in
                for manifest in self.manifests.values.sorted(by: { $0.identifier < $1.identifier }) {
                    self.topUpWarmWorkers(manifest)
                }
            }
        }
    }

    /// Counts one event for `extensionID`.
    func count(_ extensionID: String, _ counter: WritableKeyPath<HostStatistics, Int>) {
        metrics.tally(extensionID).statistics[keyPath: counter] += 1
    }

    /// Logs a line: to the configured handler, else through the bounded stderr writer (never blocking the loop).
    package func log(_ level: LogLevel, _ message: @autoclosure () -> String) {
        guard level >= configuration.logLevel, let handler = configuration.logHandler else { return }
        // A message may quote a peer (a client's bad id, a worker's protocol error): it never reaches a
        // terminal or a log with its control characters live.
        handler(level, message().displaySafe())
    }

    // MARK: Requests (loop thread)

    /// Starts `request` (loop thread). The daemon calls this directly; `submit` hops here from any thread.
    package func start(_ request: SubmittedRequest) {
        // Looked up once per request, and handed on: each lookup hashes the name and copies the manifest.
        let manifest = manifests[request.extensionID]
        let record = RequestRecord(
            id: request.id, extensionID: request.extensionID, items: request.items,
            // The extension's RequestDeadlineSeconds (or the operator's DefaultPolicy) is a limit: a request's own
            // deadline may come sooner, never later (an app's 60 s lifted a 10 s limit).
            deadline: min(request.deadline ?? .infinity, manifest?.policy.requestDeadlineSeconds ?? .infinity).nonInfinite,
            deliver: request.deliver)
        record.onWorkerAssigned = request.onWorkerAssigned
        record.progress = request.progress
        record.app = request.app
        record.forwardedBegin = request.forwardedBegin
        record.deliverForwarded = request.deliverForwarded
        record.publishesPid = request.publishesPid
        record.services = request.services
        start(record, manifest)
    }

    func start(_ record: RequestRecord, _ manifest: ExtensionManifest?) {
        loop.preconditionInLoop()
        if shuttingDown {
            record.deliver?(.interrupted(.hostShutdown))
            return
        }
        guard requests.insert(record) else {
            log(.error, "request id \(record.id) is already in flight; the second one is refused")
            record.deliver?(.interrupted(.protocolViolation("duplicate request id \(record.id)")))
            return
        }
        record.startedAt = loop.now
        record.poolKey = poolKey(manifest, app: record.app)
        if let manifest { record.slowRequestThreshold = nanoseconds(manifest.policy.slowRequestThresholdSeconds) }
        // Counted per installed extension only: a daemon client may name any number that are not, and a tally
        // (and a status entry) for each would grow without bound. Such a request ends at once, `launchFailed`.
        if let manifest {
            let tally = metrics.tally(manifest.identifier)
            record.tally = tally
            tally.statistics.requests += 1
        }
        if let deadline = record.deadline {
            let id = record.id
            record.deadlineTimer = loop.schedule(afterNanoseconds: nanoseconds(deadline)) { [unowned self] in
                self.deadlinePassed(id)
            }
        }
        dispatch(record, manifest)
    }

    /// Sends `record` to a worker with room (spawning one if allowed), or queues it, or ends it as `overloaded`
    /// when the queue is full.
    func dispatch(_ record: RequestRecord, _ manifest: ExtensionManifest?) {
        guard let manifest else {
            finish(record.id, .interrupted(.launchFailed("unknown extension \(record.extensionID)")))
            return
        }
        if endIfQuarantined(record) { return }
        switch workerWithRoom(manifest, pool: record.poolKey, app: record.app) {
        case .worker(let worker):
            send(record, to: worker)
        case .launchFailed(let error):
            finish(record.id, .interrupted(.launchFailed(error.description)))
        case .none:
            if requests.queuedCount(in: record.poolKey) >= configuration.maxQueuedRequests {
                count(record.extensionID, \.overloads)
                finish(record.id, .interrupted(.overloaded))
            } else {
                requests.enqueue(record)
            }
        }
    }

    enum Room {
        case worker(WorkerProcess)
        case launchFailed(HostError)
        case none
    }

    /// A worker that can take a request now: a live one with room, else a new one if the pool has space. A
    /// worker that has not acknowledged a cancel yet, or is past its heartbeat timeout (and waited on as starved),
    /// comes last: it may be killed, and a request sent there would be interrupted with it.
    func workerWithRoom(_ manifest: ExtensionManifest, pool key: String, app: String?) -> Room {
        let pool = workers[key]
        if let worker = pool.first(where: { $0.acceptsRequests && $0.cancelTimers.isEmpty && $0.starvationCheck == nil }) {
            return .worker(worker)
        }
        if workers.liveCount(in: key) < manifest.policy.maxWorkers {
            if let spare = adoptSpare(manifest, into: key, app: app) { return .worker(spare) }
            guard capacityAllows(pool: key, app: app) else {
                return pool.first(where: { $0.acceptsRequests }).map(Room.worker) ?? .none
            }
            // Running inline on another thread (an app's, the exit-notice watcher's): the request waits for the
            // loop thread to spawn its worker (see spawnWorker).
            guard loop.onLoopThread else {
                loop.execute { [unowned self] in self.drainWaiting(key) }
                return .none
            }
            do {
                return .worker(try spawnWorker(manifest, poolKey: key, app: app))
            } catch {
                log(.error, "\(manifest.identifier): cannot launch worker: \(error)")
                return .launchFailed(error)
            }
        }
        if let worker = pool.first(where: { $0.acceptsRequests }) { return .worker(worker) }
        return .none
    }

    func send(_ record: RequestRecord, to worker: WorkerProcess) {
        record.move(to: .running, because: "sent to a worker")
        record.worker = worker
        worker.idleTimeoutOverride = nil  // its app is back (appLeft sets it again when it leaves)
        worker.inFlight.insert(record.id)
        worker.requestsSent += 1
        if let limit = worker.policy.maxRequestsPerWorker, worker.requestsSent >= limit {
            worker.lifecycle.recycle("MaxRequestsPerWorker \(limit)")
        }
        if let timer = worker.idleTimer {
            loop.cancelTimer(timer)
            worker.idleTimer = nil
        }
        // A worker whose own pid is not known yet (its launcher has not named it) publishes it when it is.
        if worker.pidKnown { publishPid(of: record, worker.pid) }
        let items = record.items
        let forwarded = record.forwardedBegin
        // The worker has them now and the host keeps no copy, once the worker has said hello: one that dies
        // before its handshake ran no handler, and its requests are sent again, items and all.
        if worker.lifecycle.welcomed {
            record.items = []
            record.forwardedBegin = nil
        }
        if let forwarded {
            let sent = forwarded.payload.withUnsafeBytes { payload in
                Result { () throws(WireError) in
                    try worker.connection.sendForwarded(payload, id: record.id, idRange: forwarded.idRange)
                }
            }
            if case .failure(let error) = sent {
                log(.error, "\(worker.extensionID): cannot forward begin: \(error)")
                beginNotSent(record.id, to: worker, error)
            }
            return
        }
        send(.begin(id: record.id, items: items), to: worker)
    }

    /// Ends a request: removes every trace of it, then delivers. Returns false if it had already ended.
    /// `forwarded`: the worker's completion payload and its id's range, for a request that forwards it
    /// (`deliverForwarded`).
    @discardableResult
    func finish(_ id: RequestID, _ outcome: RequestOutcome,
                forwarded: (payload: UnsafeRawBufferPointer, idRange: Range<Int>)? = nil) -> Bool {
        guard let record = requests.remove(id) else { return false }
        record.move(to: .ended, because: "its outcome")
        if let timer = record.deadlineTimer {
            loop.cancelTimer(timer)
            record.deadlineTimer = nil
        }
        if let worker = record.worker {
            if record.publishesPid { pids.withLock { _ = $0.removeValue(forKey: id) } }
            // Partial results nobody will take now: credited back, so that a worker still running the request
            // (until it sees the cancel) is not left waiting for credit. (An empty table is not searched: a
            // search hashes the id, and most requests stream nothing.)
            if !worker.streamOutstanding.isEmpty, let outstanding = worker.streamOutstanding.removeValue(forKey: id),
                outstanding > 0,
                worker.inFlight.contains(id)
            {
                send(.credit(id: id, count: Int64(outstanding)), to: worker)
            }
        }
        record.worker = nil
        record.onWorkerAssigned = nil
        record.progress = nil
        record.services = nil
        if !record.hostCalls.isEmpty { cancelHostCalls(record) }
        record.items = []
        record.forwardedBegin = nil
        let deliver = record.deliver
        let deliverForwarded = record.deliverForwarded
        record.deliver = nil
        record.deliverForwarded = nil
        if case .completed = outcome { poolSucceeded(record.poolKey) }
        let elapsed = loop.now &- record.startedAt
        if let tally = record.tally, tally.record(outcome, elapsed: elapsed, slowThreshold: record.slowRequestThreshold) {
            log(.info, "\(record.extensionID): request \(id) ran \(Double(elapsed) / 1e6) ms (slow-request threshold "
                + "\(Double(record.slowRequestThreshold) / 1e6) ms)")
        }
        if let forwarded, let deliverForwarded {
            deliverForwarded(outcome, forwarded.payload, forwarded.idRange)
        } else if let deliver {
            loop.runOutsideInlineTask { deliver(outcome) }
        }
        return true
    }

    /// Ends `id` with `outcome` as a cancel does: at once, its worker told to cancel it (loop thread). The daemon's
    /// requests of a client that went away end `disconnected`.
    package func endOnLoop(_ id: RequestID, _ outcome: RequestOutcome) {
        loop.preconditionInLoop()
        guard requests[id] != nil else { return }
        abandon(id, outcome)
    }

    /// Ended requests a worker still owes an answer (none once every worker has ended).
    package var owedRequestCount: Int { endedButOwed.count }

    /// No worker runs `id` any more (it answered, its begin was never sent, or its worker ended): no answer is owed
    /// for it. The set is almost always empty, and a hash of the id is skipped then.
    func noLongerOwed(_ id: RequestID) {
        if !endedButOwed.isEmpty { endedButOwed.remove(id) }
    }

    /// Whether `id` names a request the engine holds, or one that has ended but that a worker still runs (loop
    /// thread). A new request may take an id only when it is not: a worker sent a begin for an id it still runs
    /// would take the old one's late answer for the new one's.
    package func isInUse(_ id: RequestID) -> Bool {
        requests[id] != nil || (!endedButOwed.isEmpty && endedButOwed.contains(id))
    }

    /// Cancels `id` (loop thread).
    package func cancelOnLoop(_ id: RequestID) {
        loop.preconditionInLoop()
        guard requests[id] != nil else {
            log(.debug, "cancel for \(id), which has already ended; ignored")
            return
        }
        abandon(id, .cancelled(.cancelledByHost))
    }

    func deadlinePassed(_ id: RequestID) {
        guard let record = requests[id] else { return }
        record.deadlineTimer = nil
        log(.warning, "\(record.extensionID): request \(id) passed its deadline of \(record.deadline ?? 0) s")
        count(record.extensionID, \.timeouts)
        abandon(id, .interrupted(.timedOut))
    }

    /// Ends a request the host gives up on (cancel, deadline) at once. A worker running it is told to cancel
    /// and keeps the slot until it acknowledges; only a worker that ignores the cancel past the grace period is
    /// killed (and only then are its other requests interrupted, as `hang`).
    func abandon(_ id: RequestID, _ outcome: RequestOutcome) {
        let worker = requests[id]?.worker
        finish(id, outcome)
        guard let worker, worker.inFlight.contains(id) else { return }
        endedButOwed.insert(id)
        guard !worker.lifecycle.phase.isOver, worker.connection.isOpen, worker.cancelTimers[id] == nil else { return }
        send(.cancel(id: id), to: worker)
        let grace = nanoseconds(configuration.cancelGracePeriodSeconds)
        armCancelGrace(worker, id, clock: AnswerClock(sentAt: loop.now, connection: worker.connection), check: nil, after: grace)
    }

    /// Kills `worker` if, `delay` from now, it has not acknowledged the cancel of `id` after a grace period of its
    /// own time (`clock`: the time the host was behind it is not counted), unless it is runnable and the machine is
    /// not running it (`starvation(of:since:now:)`): then it gets another grace period; either up to
    /// `starvationLimit` since the cancel.
    func armCancelGrace(_ worker: WorkerProcess, _ id: RequestID, clock: AnswerClock, check: StarvationCheck?, after delay: UInt64) {
        let grace = nanoseconds(configuration.cancelGracePeriodSeconds)
        worker.cancelTimers[id] = loop.schedule(afterNanoseconds: delay) { [unowned self, worker] in
            worker.cancelTimers[id] = nil
            guard worker.inFlight.contains(id), !worker.lifecycle.phase.isOver else { return }
            var clock = clock
            clock.look(at: self.loop.now, connection: worker.connection)
            let now = self.loop.now, waited = now &- clock.sentAt
            if waited < self.starvationLimit(grace) {
                if clock.charged < grace {
                    // The host was behind it: the rest of its grace period, from now.
                    self.armCancelGrace(worker, id, clock: clock, check: check, after: max(grace &- clock.charged, grace / 10))
                    return
                }
                if let look = self.starvation(of: worker, since: check, now: now), look.starved {
                    if check == nil {
                        self.log(.warning, "\(worker.extensionID) pid \(worker.pid) has not acknowledged the cancel of \(id) for "
                            + "\(tenths(waited)) s but is runnable: waiting to see whether it gets a CPU")
                    }
                    self.armCancelGrace(worker, id, clock: clock, check: look.check, after: grace)
                    return
                }
            }
            self.log(.warning, "\(worker.extensionID) pid \(worker.pid) ignored the cancel of \(id) for \(tenths(clock.charged)) s "
                + "(\(tenths(waited)) s since it was sent); killing it")
            self.kill(worker, .hang, forCancel: true)
        }
    }

    /// Hands queued requests to workers that have room, in order. O(1) per request handed over.
    func drainWaiting(_ key: String) {
        guard let first = requests.firstQueued(in: key), let manifest = manifests[first.extensionID] else { return }
        let app = first.app
        while requests.queuedCount(in: key) > 0 {
            switch workerWithRoom(manifest, pool: key, app: app) {
            case .worker(let worker):
                if let next = requests.popFirst(in: key) { send(next, to: worker) }
            case .launchFailed(let error):
                if let next = requests.popFirst(in: key) { finish(next.id, .interrupted(.launchFailed(error.description))) }
            case .none:
                return
            }
        }
    }

    // MARK: Shutdown

    package func shutdownOnLoop(completion: (@Sendable () -> Void)?) {
        loop.preconditionInLoop()
        if let completion { shutdownCompletions.append(completion) }
        if shuttingDown { return }
        shuttingDown = true
        keepAliveUntilStopped = self
        if let spare = spareWorkerDirectory {
            spareWorkerDirectory = nil
            workerFolders.remove(spare)
        }
        if let fd = sharedNetworkNamespace, fd >= 0 { close(fd) }
        sharedNetworkNamespace = -1
        if let folder = deviceFolder, !folder.isEmpty { removeTree(folder) }
        deviceFolder = ""  // none after this: a spawn still under way would make another
        for id in requests.ids { finish(id, .interrupted(.hostShutdown)) }
        for state in supervisor.pools.values {
            if let timer = state.retryTimer { loop.cancelTimer(timer) }
            state.retryTimer = nil
        }
        // Ask every worker to exit (its socket closes; the runtime exits on EOF and flushes its output), and
        // kill those that have not exited after the grace period.
        for worker in workers.all { retire(worker, grace: configuration.workerExitGracePeriodSeconds, because: "host stopping") }
        stopIfIdle()
    }

    /// Once shutting down and every worker is reaped, stops the loop.
    func stopIfIdle() {
        guard shuttingDown, workers.isEmpty else { return }
        if let timer = heartbeatTimer { loop.cancelTimer(timer) }
        // The loop runs this after its last task, when no handler or timer can reach the engine any more. The
        // completions are read there, not here: a second `shutdown` accepted by the loop before it stopped (the
        // bench's drain figure makes one) adds its completion after this point and must be called too.
        loop.stop { [self] in
            keepAliveUntilStopped = nil
            events.finishAll()
            let completions = shutdownCompletions
            shutdownCompletions = []
            for completion in completions { completion() }
        }
    }
}

private extension Double {
    /// Itself, or nil for infinity (no deadline).
    var nonInfinite: Double? { isInfinite ? nil : self }
}
