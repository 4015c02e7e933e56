// A seeded, single-threaded simulation of the engine: the real HostEngine on a driven event loop (no thread of
// its own: `runUntilIdle` after every step), a manual clock, and fake workers (FakeWorkers.swift). One seeded
// generator decides every step (ScheduleSteps.swift): begins (some bringing files), cancels, completions (some
// twice, sending the files back), cancel acknowledgements, partial results (some past the credit window),
// crashes, exits, exit notices (and notices that are not exits), replies for unknown ids, failed spawns, the
// clock moving; requests come from a few daemon apps, each with its own pool, and workers are recycled after
// five requests; one step in four is a daemon client's (SimClients.swift: the engine is a simulated daemon's);
// then the daemon's drain and stop. Nothing else runs, so a seed replays exactly (with deterministic hashing:
// sdk-host-simulate's main.swift).
//
// After every step it checks that no request ended twice, none was sent to a worker after it ended, and the wait
// queue stays within its bound; after the shutdown, that every request ended exactly once, the engine holds no
// request, queue entry or worker, every fake worker was reaped and its exit descriptor closed, no exit-notice
// watch is left, no handler of a request is retained, and the descriptors the schedule opened are closed.
import SDKWire
import SDKHost
import SDKDaemon
import SDKPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// SplitMix64: tiny, seedable, the same sequence on every machine, so a failure replays from a printed seed.
package struct SimulationRandom: RandomNumberGenerator {
    private var state: UInt64
    package init(seed: UInt64) { state = seed }
    /// How far the sequence has gone (the digest takes it after every step: a run that drew differently differs).
    package var position: UInt64 { state }
    package mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// What the schedules reached, over many runs.
package struct SimulationTally {
    /// Requests' outcomes by kind ("completed", "timed out", …).
    package var outcomes: [String: Int] = [:]
    /// Worker lifecycle transitions by kind ("ready→killed", …).
    package var transitions: [String: Int] {
        var named = mergedTransitions
        for (i, count) in transitionCounts.enumerated() where count > 0 {
            named[HostEngine.workerTransitionNames[i], default: 0] += count
        }
        return named
    }
    /// This process's schedules' transitions, by the engine's index of their kind (named when read: a name per
    /// kind hashed after every schedule was ~0.7% of one).
    private var transitionCounts: [Int] = []
    /// The transitions of other processes' tallies (`merge`), by name.
    private var mergedTransitions: [String: Int] = [:]

    /// Adds a schedule's `HostEngine.workerTransitionCounts`.
    mutating func addTransitions(_ counts: [Int]) {
        if transitionCounts.isEmpty { transitionCounts = counts; return }
        for i in counts.indices { transitionCounts[i] += counts[i] }
    }
    package var steps = 0
    /// Completions that brought files back to the app (descriptors passed both ways).
    package var filesReturned = 0
    /// Daemon clients, the requests they began, and the outcomes they read.
    package var clients = 0
    package var clientRequests = 0
    package var clientOutcomes = 0
    /// Schedules that found a violation (the caller counts them: `run` returns what it found).
    package var violations = 0
    /// The sum of each schedule's digest (`ScheduleDigest`): the same seeds give the same digest on every run,
    /// split over any number of processes.
    package var traceDigest: UInt64 = 0

    package init() {}

    /// The tally as lines `kind<TAB>name<TAB>count`, for a process that ran part of the schedules to hand to the one
    /// that adds them up (`merge(_:)`).
    package var lines: [String] {
        outcomes.sorted { $0.key < $1.key }.map { "outcome\t\($0.key)\t\($0.value)" }
            + transitions.sorted { $0.key < $1.key }.map { "transition\t\($0.key)\t\($0.value)" }
            + [("steps", steps), ("files", filesReturned), ("clients", clients), ("clientRequests", clientRequests),
               ("clientOutcomes", clientOutcomes), ("violations", violations)].map { "count\t\($0.0)\t\($0.1)" }
            + ["digest\t-\t\(traceDigest)"]
    }

    /// Adds a tally's `lines`; false (adding nothing more) at the first line that is not one.
    package mutating func merge(_ lines: some Sequence<Substring>) -> Bool {
        for line in lines {
            let fields = line.split(separator: "\t", omittingEmptySubsequences: false)
            guard fields.count == 3, let value = UInt64(fields[2]) else { return false }
            let name = String(fields[1]), count = Int(truncatingIfNeeded: value)
            switch fields[0] {
            case "outcome": outcomes[name, default: 0] += count
            case "transition": mergedTransitions[name, default: 0] += count
            case "digest": traceDigest &+= value
            case "count":
                switch name {
                case "steps": steps += count
                case "files": filesReturned += count
                case "clients": clients += count
                case "clientRequests": clientRequests += count
                case "clientOutcomes": clientOutcomes += count
                case "violations": violations += count
                default: return false
                }
            default: return false
            }
        }
        return true
    }

    package mutating func add(_ outcome: RequestOutcome) {
        outcomes[Self.kind(of: outcome), default: 0] += 1
    }

    /// An outcome's kind, as the tally and the trace digest name it (cheaper than describing it by reflection).
    static func kind(of outcome: RequestOutcome) -> String {
        let key: String
        switch outcome {
        case .completed: key = "completed"
        case .cancelled: key = "cancelled"
        case .interrupted(let reason):
            switch reason {
            case .signal: key = "signal"
            case .exited: key = "exited"
            case .protocolViolation: key = "protocol violation"
            case .launchFailed: key = "launch failed"
            default: key = "\(reason)"
            }
        }
        return key
    }
}

/// FNV-1a over what a schedule did, as numbers: after every step, how many requests had ended, how many the engine
/// held, how many of those were the daemon clients', and how far the generator had gone (a step whose choices
/// depend on what the engine holds draws differently when that differs); at the end, each request's id and how it
/// ended. No line of text is made for it.
struct ScheduleDigest {
    private(set) var value: UInt64 = 0xCBF2_9CE4_8422_2325

    mutating func add(_ number: UInt64) {
        var n = number
        for _ in 0..<8 {
            value = (value ^ (n & 0xFF)) &* 0x100_0000_01B3
            n >>= 8
        }
    }

    mutating func add(_ text: String) {
        for byte in text.utf8 { value = (value ^ UInt64(byte)) &* 0x100_0000_01B3 }
        value = (value ^ 0x0A) &* 0x100_0000_01B3
    }
}

/// Request ids from a seed: the same on every run.
final class IDCounter {
    private let seed: UInt64
    private var count: UInt64 = 0
    init(seed: UInt64) { self.seed = seed }
    func next() -> RequestID {
        count += 1
        return RequestID(high: seed ^ 0xD1CE, low: count)
    }
}

/// One schedule.
package struct Simulation {
    package let seed: UInt64
    package let steps: Int
    /// A failure's report lists every step, not the last 25 (`sdk-host-simulate --trace`).
    package var fullTrace = false
    /// Whether the steps are kept as lines while it runs. Off, a schedule that finds a violation is run again
    /// with it on, and the report is that run's.
    package var tracing = false
    /// A violation reported at this step whatever happened: for the tests of the report itself.
    package var failAtStep: Int?
    static let maxQueued = 6

    package init(seed: UInt64, steps: Int) {
        self.seed = seed
        self.steps = steps
    }

    /// Runs the schedule; returns what went wrong (naming the seed and the last steps), or nil.
    package func run(in world: SimulationWorld, tally: inout SimulationTally) -> String? {
        guard let problem = runOnce(in: world, tally: &tally) else { return nil }
        guard !tracing else { return problem }
        // The same seed again, keeping its steps: it must fail the same way, and its report has them.
        var replay = self
        replay.tracing = true
        var scratch = SimulationTally()
        let traced = replay.runOnce(in: world, tally: &scratch)
        if let traced, Self.headline(traced) == Self.headline(problem) { return traced }
        return problem + "\n  replayed with its steps kept, the seed "
            + (traced.map { "failed otherwise: \($0)" } ?? "did not fail: it does not replay exactly")
    }

    /// A report's first line without what differs between two runs of one seed: the process's open descriptors
    /// (their numbers and inodes), which follow "; open now".
    static func headline(_ report: String) -> Substring {
        let line = report.prefix { $0 != "\n" }
        return line.firstRange(of: "; open now").map { line[..<$0.lowerBound] } ?? line
    }

    private func runOnce(in world: SimulationWorld, tally: inout SimulationTally) -> String? {
        var rng = SimulationRandom(seed: seed)
        // What the last schedule found open at its end, if it ended cleanly (nothing ran since); else counted now.
        // Listing /proc/self/fd is an open, a getdents and a close: twice a schedule was ~1.7% of wall time.
        let descriptorsBefore = world.descriptorBaseline.count ?? openDescriptorCount()
        world.descriptorBaseline.count = nil
        // The workers' and clients' sockets, pipes and exit descriptors are simulated: no syscalls, and a
        // leak check of their own.
        let kernel = SimulatedKernel()
        SimulatedKernel.current = kernel
        defer { SimulatedKernel.current = nil }
        let clock = ManualClock()
        let launcher = SimLauncher(kernel: kernel)
        var configuration = world.hostConfiguration()
        configuration.clock = clock
        configuration.exitNoticeWatcher = launcher.notices
        configuration.drivenLoop = true
        configuration.launcher = launcher
        let folders = SimWorkerFolders()
        configuration.workerFolders = folders
        // The folders are in memory; the engine's one sweep of its temp folder for dead hosts' folders (on a
        // Dispatch thread, with a descriptor open while it reads) reads the world's small folder, not /tmp.
        configuration.temporaryDirectory = world.root
        configuration.logLevel = .error
        if getenv("SIM_LOG") != nil {
            configuration.logLevel = .debug
            configuration.logHandler = { @Sendable level, line in print("LOG \(level) \(line)") }
        } else {
            configuration.logHandler = { _, _ in }
        }
        configuration.maxQueuedRequests = Self.maxQueued
        configuration.cancelGracePeriodSeconds = 1
        configuration.heartbeatIntervalSeconds = 1
        configuration.heartbeatTimeoutSeconds = 3
        configuration.workerExitGracePeriodSeconds = 1
        let state = ScheduleState(identifier: SimulationWorld.identifier, tracing: tracing, files: world.appFiles)
        var digest = ScheduleDigest()
        func failure(_ what: String) -> String {
            guard tracing else { return "seed \(seed): \(what)" }
            return "seed \(seed): \(what)\n  \(fullTrace ? "steps" : "last steps"):\n    "
                + state.trace.lines.suffix(fullTrace ? state.trace.lines.count : 25).joined(separator: "\n    ")
        }
        let clients = SimClients(files: world.clientFiles)
        let problem: String? = {
            // The daemon's engine serves both the embedded app's requests (`submit`) and the daemon's clients.
            var daemonConfiguration = DaemonConfiguration(defaultExtensionSearchPaths: [world.root])
            daemonConfiguration.host = configuration
            daemonConfiguration.drainTimeout = 2
            daemonConfiguration.handshakeTimeout = 2
            daemonConfiguration.partialFrameTimeout = 2
            daemonConfiguration.maxInFlightRequests = 6
            daemonConfiguration.maxClientOutputBytes = 4096
            daemonConfiguration.maxUnreadDescriptorsPerClient = 4
            let daemon: DaemonServer
            do {
                daemon = try DaemonServer(simulating: daemonConfiguration)
            } catch {
                return "seed \(seed): cannot create the daemon: \(error)"
            }
            // Its requests' ids towards the workers from the seed, not from the process's random key.
            let ids = IDCounter(seed: seed)
            daemon.makeRequestID = { ids.next() }
            let engine = daemon.engine
            engine.loop.execute { daemon.startSimulated() }
            /// Workers seen reaped so far.
            var reaped: Set<pid_t> = []
            func checkStep() -> String? {
                if let late = state.lateBegin { return failure("request \(late) was sent to a worker after it had ended") }
                if let late = state.partials.withLock({ $0.afterEnd }) {
                    return failure("request \(late) had a partial result after its outcome")
                }
                if let twice = state.endedTwice {
                    let ends = state.outcomes.withLock { $0[twice] ?? [] }
                    return failure("request \(twice) ended \(ends.count) times: \(ends)")
                }
                let endedCount = state.outcomes.withLock { $0.count }
                let clientRequests = daemon.clientRequestCount
                digest.add(UInt64(endedCount))
                digest.add(UInt64(engine.activeRequestCount))
                digest.add(UInt64(clientRequests))
                // Per pool: MaxQueuedRequests, plus the requests of workers that died before their handshake, which
                // go back to the front (at most MaxWorkers × MaxConcurrentRequests = 4 at a time).
                if engine.longestQueue > Self.maxQueued + 4 {
                    return failure("a queue of \(engine.longestQueue) requests, past MaxQueuedRequests \(Self.maxQueued) + 4 requeued")
                }
                if engine.activeRequestCount - clientRequests + endedCount != state.begun.count {
                    return failure("\(state.begun.count) begun, \(endedCount) ended, \(engine.activeRequestCount) held "
                        + "(\(clientRequests) of them the daemon's clients')")
                }
                if let problem = clients.problem { return failure(problem) }
                // A client may begin an id again once its request has ended: counted per id, that is another request.
                if let id = state.sentTooOften, !clients.reusedAnywhere(id) {
                    return failure("request \(id) was sent to more than three workers")
                }
                if let (id, pid) = state.beganWhileRunning {
                    return failure("worker \(pid) was sent a begin for \(id) while it still ran a request of that id")
                }
                if let id = state.overrunStillRunning(engine, reused: clients.reusedAnywhere) {
                    return failure("request \(id) still runs after its worker sent 20 partial results without credit")
                }
                if daemon.largestClientInFlight > daemonConfiguration.maxInFlightRequests {
                    return failure("a client has \(daemon.largestClientInFlight) requests in flight, past MaxInFlightRequests "
                        + "\(daemonConfiguration.maxInFlightRequests)")
                }
                // A worker's death, once reaped, ends what it was running (or sends it on): nothing stays with it.
                // The reaped are noted once each (a worker stays reaped).
                for worker in launcher.workers where !worker.alive && !worker.notedReaped && worker.shared.withLock({ $0.reaped }) {
                    worker.notedReaped = true
                    reaped.insert(worker.pid)
                }
                if !reaped.isEmpty, let (id, pid) = engine.requestServed(byAnyOf: reaped) {
                    return failure("request \(id) is still with worker \(pid), which is dead and reaped")
                }
                return nil
            }
            var violation: String?

            engine.loop.runUntilIdle()
            for step in 0..<steps {
                // What the workers answer and the step's own action are handled in one run of the loop.
                state.giveCredits(to: engine)
                state.pumpWorkers(launcher)
                clients.pump()
                // One step in four is a daemon client's.
                if rng.next() % 4 == 0 {
                    clients.step(&rng, daemon: daemon, identifier: SimulationWorld.identifier, trace: &state.trace)
                } else {
                    state.step(&rng, engine: engine, launcher: launcher, clock: clock, apps: true)
                }
                engine.loop.runUntilIdle()
                tally.steps += 1
                digest.add(rng.position)
                // After every step. A violation ends the schedule, after the shutdown below (which releases
                // the engine's descriptors).
                if let problem = step == failAtStep ? failure("told to fail at step \(step)") : checkStep() {
                    violation = problem
                    break
                }
            }

            // Shutdown as SIGTERM does it (the daemon drains, then stops the engine), with workers that exit when
            // their socket closes, clients that read, and a clock that moves.
            state.trace.append("shutdown")
            engine.loop.execute { daemon.stopSimulated() }
            var rounds = 0
            while engine.loop.runUntilIdle(), rounds < 500 {
                rounds += 1
                state.pumpWorkers(launcher)
                clients.pump()
                clock.advance(by: 200_000_000)
            }
            let clientProblem = clients.finish()
            guard daemon.stopped else { return violation ?? failure("shutdown never completed") }
            if let violation { return violation }
            if let clientProblem { return failure(clientProblem) }
            if daemon.sessionCount != 0 { return failure("\(daemon.sessionCount) client session(s) left") }
            if daemon.heldByClientRequests != (0, 0) {
                return failure("the daemon still counts \(daemon.heldByClientRequests) bytes and descriptors of requests")
            }
            if let late = state.lateBegin { return failure("request \(late) was sent to a worker after it had ended") }
            let all = state.outcomes.withLock { $0 }
            for id in state.begun where all[id]?.count != 1 {
                return failure("request \(id) ended \(all[id]?.count ?? 0) times: \(all[id] ?? [])")
            }
            if engine.activeRequestCount != 0 { return failure("\(engine.activeRequestCount) request(s) still held") }
            if engine.queuedRequestCount != 0 { return failure("a queue still holds requests") }
            if engine.listedWorkerCount != 0 { return failure("workers still listed") }
            if engine.owedRequestCount != 0 { return failure("\(engine.owedRequestCount) ended request(s) still noted as owed by a worker") }
            for worker in launcher.workers {
                let s = worker.shared.withLock { $0 }
                if worker.alive || !s.reaped || s.exitFDOpen { return failure("fake worker \(worker.pid) not reaped and closed") }
            }
            if launcher.notices.count != 0 { return failure("\(launcher.notices.count) exit-notice watch(es) outlived their workers") }
            if let problem = folders.problem { return failure(problem) }
            if !folders.live.isEmpty { return failure("worker temp folder(s) left: \(folders.live.joined(separator: ", "))") }
            for outcome in all.values.compactMap({ $0.first }) { tally.add(outcome) }
            tally.filesReturned += state.filesReturned.withLock { $0 }
            tally.clients += clients.clients.count
            for client in clients.clients {
                tally.clientRequests += client.requests.count
                tally.clientOutcomes += client.outcomes.values.reduce(0, +)
            }
            tally.addTransitions(engine.workerTransitionCounts)
            return nil
        }()
        // Every step, and how each request ended.
        let ends = state.outcomes.withLock { $0 }
        for id in state.begun {
            digest.add(id.high)
            digest.add(id.low)
            for outcome in ends[id] ?? [] { digest.add(SimulationTally.kind(of: outcome)) }
        }
        tally.traceDigest &+= digest.value
        if problem == nil, state.retainsAHandler { return failure("a request's handler is still retained") }
        if problem == nil, kernel.openCount > 0 {
            return failure("\(kernel.openCount) simulated descriptor(s) left open: \(kernel.openDescriptors.map(String.init).joined(separator: ", "))")
        }
        if problem == nil {
            // Another thread may hold a descriptor for a moment (the engine's first spawn in this process sweeps
            // the temp folder on a Dispatch queue): a leak is one still open a second later.
            var open = openDescriptorCount(), waited = 0
            while open > descriptorsBefore, waited < 1000 {
                usleep(1000)
                waited += 1
                open = openDescriptorCount()
            }
            if open > descriptorsBefore {
                return failure("\(open - descriptorsBefore) descriptor(s) left open; open now: "
                    + openDescriptors().sorted().joined(separator: ", "))
            }
            // A count that failed (-1: the listing could not be opened) is not carried: the next schedule counts.
            if open >= 0 { world.descriptorBaseline.count = open }
        }
        return problem
    }
}
