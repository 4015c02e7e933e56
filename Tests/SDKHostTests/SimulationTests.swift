// Randomized, seeded schedules through the real engine, with the fake workers of SDKSimulation. Two runs: the
// engine on its own loop thread with the schedule on the test's (inline entry points and thread hand-offs
// included), and the single-threaded simulation of `sdk-host-simulate`, briefly. After each schedule:
// every request begun got exactly one outcome, the engine holds no request, queue entry or handler, and every
// fake worker was reaped and its exit descriptor closed. A failure prints its seed; rerun one schedule with
// SDKHOST_SIM_SEED=<seed>, or many with SDKHOST_SIM_SCHEDULES=<n>:
//   SDKHOST_SIM_SCHEDULES=100000 swift test --filter SimulationTests
import SDKWire
import HostTestSupport
@testable import SDKHost
import SDKPosix
import SDKSimulation
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

struct ThreadedSimulation {
    let seed: UInt64
    let steps: Int
    static let identifier = "com.example.sim"
    /// Outcomes by kind over all schedules, so the test can show the schedules reach every kind.
    static let kinds = Mutex(SimulationTally())

    /// Runs one schedule; returns what went wrong, or nil.
    func run(manifestRoot: String) async -> String? {
        var rng = SeededGenerator(seed: seed)
        let clock = ManualClock()
        let launcher = SimLauncher()
        var configuration = HostConfiguration(extensionSearchPaths: [manifestRoot])
        configuration.clock = clock
        configuration.exitNoticeWatcher = launcher.notices
        configuration.launcher = launcher
        configuration.logLevel = .error
        configuration.logHandler = { _, _ in }
        configuration.maxQueuedRequests = 3  // small, so that schedules reach `overloaded`
        configuration.cancelGracePeriod = .seconds(1)
        configuration.heartbeatInterval = .seconds(1)
        configuration.heartbeatTimeout = .seconds(3)
        configuration.workerExitGracePeriod = .seconds(1)
        let engine: HostEngine
        do {
            engine = try HostEngine(configuration: configuration)
        } catch {
            return "cannot create the engine: \(error)"
        }
        let state = ScheduleState(identifier: ThreadedSimulation.identifier)
        func settle() async {
            for _ in 0..<4 {
                await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                    if !engine.loop.execute({ c.resume() }) { c.resume() }
                }
            }
        }
        for _ in 0..<steps {
            state.giveCredits(to: engine)
            state.pumpWorkers(launcher)
            state.step(&rng, engine: engine, launcher: launcher, clock: clock, apps: false)
            engine.loop.wake()  // the clock may have moved
            await settle()
        }

        // Shutdown, with workers that exit when their socket closes and a clock that moves.
        state.trace.append("shutdown")
        defer { state.files.close() }
        let stopped = Mutex(false)
        engine.shutdown { stopped.withLock { $0 = true } }
        var rounds = 0
        while !stopped.withLock({ $0 }) && rounds < 500 {
            rounds += 1
            await settle()
            state.pumpWorkers(launcher)
            clock.advance(by: 200_000_000)
            engine.loop.wake()
        }
        // The loop stops as soon as the last worker is reaped, but calls the completion only after it has released
        // its state; its thread may be preempted in between for longer than the rounds above take. Once it accepts
        // no more tasks, the stop has been decided: wait for the completion in real time.
        if !stopped.withLock({ $0 }), !engine.loop.execute({}) {
            _ = await eventually(timeout: 30) { stopped.withLock { $0 } }
        }
        func failure(_ what: String) -> String {
            "seed \(seed): \(what)\n  last steps: " + state.trace.lines.suffix(25).joined(separator: "\n    ")
        }
        guard stopped.withLock({ $0 }) else { return failure("shutdown never completed") }
        if let late = state.lateBegin { return failure("request \(late) was sent to a worker after it had ended") }
        let all = state.outcomes.withLock { $0 }
        for id in state.begun where all[id]?.count != 1 {
            return failure("request \(id) ended \(all[id]?.count ?? 0) times: \(all[id] ?? [])")
        }
        // The loop has stopped: its state can be read from here.
        if !engine.requests.isEmpty { return failure("\(engine.requests.count) request(s) still held") }
        if engine.requests.queuedCount != 0 { return failure("a queue still holds requests") }
        if !engine.workers.isEmpty { return failure("workers still listed") }
        for worker in launcher.workers {
            let s = worker.shared.withLock { $0 }
            if worker.alive || !s.reaped || s.exitFDOpen { return failure("fake worker \(worker.pid) not reaped and closed") }
        }
        if state.retainsAHandler { return failure("a request's handler is still retained") }
        ThreadedSimulation.kinds.withLock { tally in for outcome in all.values.compactMap(\.first) { tally.add(outcome) } }
        return nil
    }
}

@Suite(.serialized) struct SimulationTests {
    @Test func randomSchedulesEndEveryRequestExactlyOnceAndRetainNothing() async throws {
        let temp = TemporaryExtension(identifier: ThreadedSimulation.identifier, executable: "Echo", policy: """
            <key>MaxWorkers</key><integer>2</integer><key>MaxConcurrentRequests</key><integer>2</integer>
            <key>IdleTimeoutSeconds</key><real>4</real>
            """)
        defer { temp.remove() }
        let seeds: [UInt64]
        if let one = environmentValue("SDKHOST_SIM_SEED").flatMap({ UInt64($0) }) {
            seeds = [one]
        } else {
            let count = environmentValue("SDKHOST_SIM_SCHEDULES").flatMap { Int($0) } ?? 300
            let base = environmentValue("SDKHOST_SIM_BASE").flatMap { UInt64($0) } ?? 0x5D4_0000
            seeds = (0..<UInt64(count)).map { base + $0 }
        }
        // The runtime opens a pipe of its own at the first Task.sleep (in `eventually` below): open it before the
        // baseline, or a run of this test alone counts it as a leak.
        try? await Task.sleep(nanoseconds: 1_000_000)
        let baseline = ResourceSnapshot.take()
        var failures = 0
        for seed in seeds {
            if let problem = await ThreadedSimulation(seed: seed, steps: 80).run(manifestRoot: temp.root) {
                Issue.record(Comment(rawValue: problem))
                failures += 1
                if failures >= 3 { break }
            }
        }
        let leak = await leaksSince(baseline)
        #expect(leak == nil, "descriptors or loop threads left by the schedules: \(leak ?? "")")
        // The schedules must reach every kind of ending, or they prove less than they claim.
        let kinds = ThreadedSimulation.kinds.withLock { $0.outcomes }
        print("simulation: \(seeds.count) schedules; outcomes \(kinds.sorted { $0.key < $1.key })")
        if seeds.count >= 100 {
            for kind in ["completed", "cancelled", "signal", "exited", "protocol violation", "launch failed", "timed out", "overloaded", "host shut down", "hang"] {
                #expect(kinds[kind, default: 0] > 0, "no schedule ended a request as \(kind)")
            }
        }
    }

    /// The single-threaded simulation (`sdk-host-simulate`), briefly: every schedule replays from its seed, and
    /// the run must reach every kind of ending and of worker transition it claims to cover. In a process of its
    /// own: each schedule's leak check counts the process's descriptors, and the suites running beside this one
    /// open and close theirs meanwhile (seen: a daemon test's sockets counted as a schedule's leak).
    @Test func theSingleThreadedSimulationFindsNoViolation() async throws {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            Self.runShortSimulation()
        }
        let output = String(decoding: try #require(result).standardOutputContent, as: UTF8.self)
        let lines = output.split(separator: "\n")
        let problems = lines.filter { $0.hasPrefix("PROBLEM ") }
        #expect(problems.isEmpty, "\(problems.joined(separator: "\n"))")
        var tally = SimulationTally()
        let merged = tally.merge(lines.filter { $0.hasPrefix("TALLY\t") }.map { $0.dropFirst(6) })
        #expect(merged, "\(output)")
        for kind in ["completed", "cancelled", "signal", "exited", "protocol violation", "launch failed", "timed out", "hang",
                     "host shut down", "quarantined"] {
            #expect(tally.outcomes[kind, default: 0] > 0, "no schedule ended a request as \(kind): \(tally.outcomes)")
        }
        for kind in ["starting→ready", "ready→killed", "killed→dead", "ready→retiring", "retiring→dead", "ready→dead",
                     "ready→exiting", "exiting→dead", "ready→draining", "starting→dead", "starting→killed"] {
            #expect(tally.transitions[kind, default: 0] > 0, "no worker went \(kind): \(tally.transitions)")
        }
        #expect(tally.filesReturned > 0, "no completion brought a file back")
        #expect(tally.clientOutcomes > 100, "daemon clients read \(tally.clientOutcomes) outcomes")
        // The same seed, run again, replays the same schedule.
        #expect(lines.contains("REPLAY same"), "\(output)")
    }

    /// The body of `theSingleThreadedSimulationFindsNoViolation`, in its own process: prints each violation
    /// (`PROBLEM`), the tally (`TALLY` lines) and whether one seed run twice replayed (`REPLAY`).
    static func runShortSimulation() {
        guard let world = try? SimulationWorld(executable: "\(currentExecutableDirectory() ?? ".")/sdk-host-launcher") else {
            print("PROBLEM cannot make the simulation's manifest")
            return
        }
        defer { world.remove() }
        world.warmUp()
        var tally = SimulationTally()
        var problems = 0
        for seed in UInt64(0x5D4_0000)..<UInt64(0x5D4_0000 + 300) {
            if let problem = Simulation(seed: seed, steps: 80).run(in: world, tally: &tally) {
                print("PROBLEM " + problem.split(separator: "\n").joined(separator: " | "))
                problems += 1
            }
            if problems >= 3 { break }
        }
        for line in tally.lines { print("TALLY\t" + line) }
        var first = SimulationTally(), second = SimulationTally()
        _ = Simulation(seed: 0x5D4_0007, steps: 80).run(in: world, tally: &first)
        _ = Simulation(seed: 0x5D4_0007, steps: 80).run(in: world, tally: &second)
        let same = first.outcomes == second.outcomes && first.transitions == second.transitions
            && first.clientOutcomes == second.clientOutcomes && first.clientRequests == second.clientRequests
            && first.traceDigest == second.traceDigest
        print(same ? "REPLAY same" : "REPLAY differs: \(first.lines) against \(second.lines)")
    }

    /// A schedule runs without keeping its steps; one that fails is run again keeping them, and the report names
    /// the seed and lists the last steps of that replay.
    @Test func aViolationIsReportedWithTheStepsOfItsReplay() throws {
        let world = try SimulationWorld(executable: "/bin/true")
        defer { world.remove() }
        world.warmUp()
        var simulation = Simulation(seed: 0x5D4_0007, steps: 80)
        simulation.failAtStep = 30
        var tally = SimulationTally()
        let report = try #require(simulation.run(in: world, tally: &tally))
        #expect(report.hasPrefix("seed \(0x5D4_0007): told to fail at step 30\n  last steps:\n"), "\(report)")
        let steps = report.split(separator: "\n").dropFirst(2)
        #expect(steps.count == 25, "\(report)")
        #expect(steps.allSatisfy { $0.hasPrefix("    ") && $0.count > 8 }, "\(report)")
        // Kept from the start, the same steps are the tail of the full list.
        simulation.tracing = true
        simulation.fullTrace = true
        let full = try #require(simulation.run(in: world, tally: &tally))
        #expect(full.split(separator: "\n").suffix(25) == report.split(separator: "\n").suffix(25), "\(full)")
    }
}
