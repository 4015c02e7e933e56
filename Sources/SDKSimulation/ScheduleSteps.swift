// One schedule's steps and what they record, shared by the single-threaded simulation (Simulation.swift) and
// the suite's threaded variant, where the engine keeps its own loop thread.
import SDKWire
import SDKHost
import SDKPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A schedule's steps as lines, for a failure's report. Off, it builds none: a line is only made when it is kept.
/// The simulation runs with it off and replays a seed that failed with it on (a seed replays exactly), so only that
/// one report pays for the lines; they had been ~8% of every schedule.
package struct StepTrace {
    package let enabled: Bool
    package private(set) var lines: [String] = []

    package init(enabled: Bool) { self.enabled = enabled }

    package mutating func append(_ line: @autoclosure () -> String) {
        if enabled { lines.append(line()) }
    }
}

/// The files begins bring: descriptors of one sealed memfd, made at the first one needed (or by `prepare()`). A
/// new descriptor of it is one syscall (a dup); a new memfd was four and an inode to make and free, ~3% of a
/// schedule. The engine checks and passes each as it would any file; `close()` ends the memfd's own descriptor.
/// `sdk-host-simulate` makes one per process for all its schedules (`SimulationWorld`); a memfd per schedule was
/// ~1% more.
package final class SimFiles {
    private let bytes: [UInt8]
    @exclusivity(unchecked) private var template: FileAttachment?

    package init(bytes: [UInt8]) { self.bytes = bytes }

    /// What the app's and the daemon clients' files hold.
    package static let appBytes = [UInt8](repeating: 7, count: 16), clientBytes = [UInt8](repeating: 9, count: 8)

    /// Makes the memfd now: before a schedule's leak check counts the process's descriptors.
    package func prepare() {
        if template == nil { template = try? FileAttachment(bytes: bytes) }
    }

    /// A descriptor of the memfd, or nil if it cannot be made.
    package func next() -> FileAttachment? {
        prepare()
        guard let template else { return nil }
        let fd = fcntl(template.rawDescriptor, F_DUPFD_CLOEXEC, 0)
        return fd >= 0 ? FileAttachment(adopting: fd) : nil
    }

    /// Closes the memfd's own descriptor (the schedule's leak check counts it otherwise).
    package func close() { template = nil }
}

/// What a schedule has done so far: the requests it began and how each ended, the partial results the app took,
/// the handlers that must be released, and a trace of its steps for a failure's report.
package final class ScheduleState: @unchecked Sendable {
    // @unchecked Sendable: `outcomes` and `partials` are locked (the loop thread delivers into them); the rest is
    // the simulating thread's alone.
    package let identifier: String
    // `@exclusivity(unchecked)`: the harness's own state, touched by the simulating thread alone, read and written
    // after every step (the runtime's access checks on it were ~3% of a schedule).
    @exclusivity(unchecked) package private(set) var begun: [RequestID] = []
    @exclusivity(unchecked) package var trace: StepTrace
    package let outcomes = Mutex<[RequestID: [RequestOutcome]]>([:])
    /// Requests that ended since the last pump began (for `endedBeforeLastPump`), and the first that ended twice:
    /// kept as outcomes arrive, so that no step walks every outcome.
    private let ends = Mutex<(since: [RequestID], twice: RequestID?)>(([], nil))
    /// The first request that ended more than once.
    package var endedTwice: RequestID? { ends.withLock { $0.twice } }
    /// Partial results the app has taken and not yet credited (`giveCredits`).
    private let credits = Mutex<[RequestID]>([])
    /// Completions that brought files back.
    package let filesReturned = Mutex(0)
    /// Partial results the app took per request, and the first request that had one after its outcome.
    package let partials = Mutex<(taken: [RequestID: Int], afterEnd: RequestID?)>(([:], nil))
    /// A request that was sent to a worker after it had ended, if any.
    @exclusivity(unchecked) package private(set) var lateBegin: RequestID?
    /// A worker sent a begin for an id it still ran, and that worker.
    @exclusivity(unchecked) package private(set) var beganWhileRunning: (id: RequestID, pid: pid_t)?
    /// How many workers were sent each request, and the first request sent to more than three (a request goes
    /// back to the queue at most twice when its worker dies before its handshake).
    @exclusivity(unchecked) private var sends: [RequestID: Int] = [:]
    @exclusivity(unchecked) package private(set) var sentTooOften: RequestID?
    /// Requests whose worker sent a burst of partial results past the credit window while they ran, and the
    /// pump count then: each must end once the killed worker's death has been seen (by two pumps later).
    @exclusivity(unchecked) private var overran: [(id: RequestID, pump: Int)] = []
    @exclusivity(unchecked) private var pumps = 0
    /// An overrun request (the app's, or a daemon client's) the engine still holds two pumps after its burst.
    /// `reused`: whether an id was begun again since (then it may name a new request).
    package func overrunStillRunning(_ engine: HostEngine, reused: (RequestID) -> Bool = { _ in false }) -> RequestID? {
        overran.first { $0.pump < pumps - 1 && engine.holds($0.id) && !reused($0.id) }?.id
    }
    @exclusivity(unchecked) private var handles: [Weak] = []
    /// Requests that had ended when the previous pump started: a begin read now was written after that pump
    /// (everything before it was flushed), so it must not be for one of these.
    @exclusivity(unchecked) private var endedBeforeLastPump: Set<RequestID> = []

    /// The files the app's begins bring.
    package let files: SimFiles

    /// `files`: the app's files, if not a memfd of this schedule's own.
    package init(identifier: String, tracing: Bool = true, files: SimFiles? = nil) {
        self.identifier = identifier
        trace = StepTrace(enabled: tracing)
        self.files = files ?? SimFiles(bytes: SimFiles.appBytes)
        // A schedule of 80 steps begins ~35 requests: its tables are made that size at once, not grown (and
        // every id hashed again) several times over.
        outcomes.withLock { $0.reserveCapacity(64) }
        sends.reserveCapacity(64)
        endedBeforeLastPump.reserveCapacity(64)
        begun.reserveCapacity(64)
        handles.reserveCapacity(64)
    }

    /// Whether a handler of a request is still retained.
    package var retainsAHandler: Bool { handles.contains { $0.value != nil } }

    /// Credits the partial results the app took since the last step.
    package func giveCredits(to engine: HostEngine) {
        for id in credits.withLock({ c in defer { c = [] }; return c }) { engine.credit(id, 1) }
    }

    /// Lets every live fake worker read what the host sent and answer what a runtime answers by itself (hello,
    /// ping); a worker the host killed dies, one whose socket the host closed exits.
    package func pumpWorkers(_ launcher: SimLauncher) {
        // Under the outcomes' lock, which `deliver` holds while it records both: no outcome is half recorded.
        let endedSince = outcomes.withLock { _ in ends.withLock { e in defer { e.since = [] }; return e.since } }
        defer { endedBeforeLastPump.formUnion(endedSince) }
        pumps += 1
        for worker in launcher.workers where worker.alive {
            if worker.shared.withLock({ $0.killRequested }) {
                worker.die(.signaled(SIGKILL))
                continue
            }
            let seen = worker.begins.count
            let endOfFile = worker.pump(identifier: identifier)
            if beganWhileRunning == nil, let id = worker.beganWhileRunning { beganWhileRunning = (id, worker.pid) }
            if lateBegin == nil, let late = worker.begins[seen...].first(where: endedBeforeLastPump.contains) {
                lateBegin = late
            }
            for id in worker.begins[seen...] {
                sends[id, default: 0] += 1
                if sends[id]! > 3, sentTooOften == nil { sentTooOften = id }
            }
            if endOfFile { worker.die(.exited(0)) }
        }
    }

    /// One step drawn from `rng`: a begin (with or without a deadline, one in eight bringing a file; with
    /// `apps`, half from one of three daemon apps), a cancel, a worker that completes (sending back its begin's
    /// files; sometimes twice), acknowledges a cancel, sends a partial result (sometimes a burst past the credit
    /// window), crashes or exits (some with half a frame written), starts exiting with an exit notice, gets a notice
    /// that is not an exit, replies for an unknown id, a spawn that fails, a spawn that starts slowly (and welcomes,
    /// crashes or exits 0 before its handshake at a later step), or the clock moving.
    package func step(_ rng: inout SimulationRandom, engine: HostEngine, launcher: SimLauncher, clock: ManualClock,
                      apps: Bool)
    {
        func randomWorker(_ which: (FakeWorker) -> Bool) -> FakeWorker? {
            let candidates = launcher.workers.filter { $0.alive && which($0) }
            return candidates.isEmpty ? nil : candidates[Int(rng.next() % UInt64(candidates.count))]
        }
        func short(_ id: RequestID) -> Substring { id.uuidString.prefix(8) }
        /// Begins one request for `app`.
        func begin(app: String?) {
            let id = RequestID(high: rng.next(), low: rng.next())
            let deadline: Double? = rng.next() % 10 < 3 ? Double(rng.next() % 3000 + 1) / 1000 : nil
            // One in eight brings a file (a sealed memfd), which its worker's completion sends back.
            let files = rng.next() % 8 == 0 ? [files.next()].compactMap { $0 } : []
            let handle = Handle()
            handles.append(Weak(handle))
            begun.append(id)
            trace.append("begin \(short(id)) deadline \(deadline.map { "\($0)" } ?? "-")" + (app.map { " app \($0)" } ?? "")
                + (files.isEmpty ? "" : " with a file"))
            engine.submit(SubmittedRequest(
                id: id, extensionID: identifier, items: [ExtensionItem(title: "sim", fileAttachments: files)],
                deadline: deadline, onWorkerAssigned: nil,
                deliver: { [self, handle] outcome in
                    // Kept without its items: the files a completion brought close with them.
                    let kept: RequestOutcome
                    if case .completed(let items) = outcome {
                        kept = .completed([])
                        if items.contains(where: { !$0.fileAttachments.isEmpty }) { self.filesReturned.withLock { $0 += 1 } }
                    } else {
                        kept = outcome
                    }
                    withExtendedLifetime(handle) {
                        // The outcome and its note in `ends` together (locks taken in this order only).
                        self.outcomes.withLock { o in
                            o[id, default: []].append(kept)
                            let count = o[id]!.count
                            self.ends.withLock { e in
                                if count == 1 { e.since.append(id) } else if e.twice == nil { e.twice = id }
                            }
                        }
                    }
                },
                progress: { [self, handle] _ in
                    withExtendedLifetime(handle) {
                        let over = self.outcomes.withLock { $0[id] != nil }
                        self.partials.withLock { p in
                            p.taken[id, default: 0] += 1
                            if over, p.afterEnd == nil { p.afterEnd = id }
                        }
                        // The app has it; it says so at the next step, as an app busy with it would, later.
                        self.credits.withLock { $0.append(id) }
                    }
                },
                app: app))
        }
        switch rng.next() % 100 {
        case 0..<25:
            let app: String? = apps && rng.next() % 2 == 0 ? "0/app\(rng.next() % 3)" : nil
            // One in twelve is a burst of ten for one pool: past MaxQueuedRequests, some end `overloaded`.
            let burst = rng.next() % 12 == 0
            if burst { trace.append("a burst of 10 begins" + (app.map { " for \($0)" } ?? "")) }
            for _ in 0..<(burst ? 10 : 1) { begin(app: app) }
        case 25..<35:
            guard !begun.isEmpty else { break }
            let id = begun[Int(rng.next() % UInt64(begun.count))]
            trace.append("cancel \(short(id))")
            engine.cancel(id)
        case 35..<60:
            guard let worker = randomWorker({ !$0.pending.isEmpty }) else { break }
            let id = worker.pending.remove(at: Int(rng.next() % UInt64(worker.pending.count)))
            let files = worker.files.removeValue(forKey: id) ?? []
            trace.append("worker \(worker.pid) completes \(short(id))" + (files.isEmpty ? "" : " with its \(files.count) file(s)"))
            worker.send(.complete(id: id, items: [ExtensionItem(title: "done", fileAttachments: files)]))
            if rng.next() % 10 == 0 {
                trace.append("worker \(worker.pid) completes \(short(id)) again")
                worker.send(.complete(id: id, items: [ExtensionItem(title: "again")]))
            }
        case 60..<65:
            guard let worker = randomWorker({ !$0.cancelRequested.isEmpty }) else { break }
            let id = worker.cancelRequested.removeFirst()
            worker.pending.removeAll { $0 == id }
            worker.files[id] = nil
            trace.append("worker \(worker.pid) acknowledges the cancel of \(short(id))")
            worker.send(.cancelled(id: id, error: .cancelledByHost))
        case 65..<68:
            guard let worker = randomWorker({ _ in true }) else { break }
            // One in four as it writes a frame: half of it is left on its socket.
            let midFrame = rng.next() % 4 == 0
            trace.append("worker \(worker.pid) crashes" + (midFrame ? " with half a frame written" : ""))
            if midFrame { worker.sendHalfAFrame() }
            worker.die(.signaled(SIGSEGV))
        case 68..<70:
            // The kernel starts the worker's exit and its exit notice fires before the teardown: the engine ends
            // its requests now and reaps it when its exit descriptor fires, here or at a later step.
            guard let worker = randomWorker({ w in w.exitNotice.map(launcher.notices.isWatched) ?? false }),
                let page = worker.exitNotice
            else { break }
            let status: SDKPosix.ExitStatus = rng.next() % 2 == 0 ? .signaled(SIGABRT) : .exited(3)
            let diesNow = rng.next() % 2 == 0
            trace.append("worker \(worker.pid) starts exiting (\(status)); exit notice" + (diesNow ? ", gone at once" : ""))
            worker.noticedStatus = status
            _ = launcher.notices.fire(page, .exiting(status))
            if diesNow { worker.die(status) }
        case 70..<73:
            guard let worker = randomWorker({ _ in true }) else { break }
            // One in four leaves half a frame: a truncated frame, its requests' protocol violation.
            let midFrame = rng.next() % 4 == 0
            trace.append("worker \(worker.pid) exits" + (midFrame ? " with half a frame written" : ""))
            if midFrame { worker.sendHalfAFrame() }
            worker.die(.exited(0))
        case 73..<74:
            // A notice that is not an exit: the watch ends and the worker goes on.
            guard let worker = randomWorker({ w in w.exitNotice.map(launcher.notices.isWatched) ?? false }),
                let page = worker.exitNotice
            else { break }
            let notices: [ExitNoticeWatcher.Notice] = [.notExiting, .tooManyWakeups, .unreadable(EIO)]
            let notice = notices[Int(rng.next() % 3)]
            trace.append("worker \(worker.pid): exit notice \(notice), not exiting")
            _ = launcher.notices.fire(page, notice)
        case 74..<75:
            guard let worker = randomWorker({ _ in true }) else { break }
            trace.append("worker \(worker.pid) replies for an unknown id")
            worker.send(.complete(id: RequestID(high: rng.next(), low: rng.next()), items: []))
        case 75..<77:
            trace.append("the next spawn fails")
            launcher.failNextSpawn()
        case 77..<85:
            guard let worker = randomWorker({ !$0.pending.isEmpty }) else { break }
            let id = worker.pending[Int(rng.next() % UInt64(worker.pending.count))]
            // Now and then a burst past the window of 16 uncredited: a protocol violation.
            let count = rng.next() % 20 == 0 ? 20 : 1
            trace.append("worker \(worker.pid) sends \(count) partial result(s) for \(short(id))")
            if count == 20, outcomes.withLock({ $0[id] == nil }) { overran.append((id, pumps)) }
            for _ in 0..<count { worker.send(.partial(id: id, items: [ExtensionItem(title: "part")])) }
        case 85..<86:
            trace.append("the next spawn starts slowly")
            launcher.slowNextSpawn()
        case 86..<88:
            // A worker that has not said welcome yet: it does now, or dies before its handshake (its requests go
            // back to the queue, at most twice; the engine counts an exit 0 then as a crash, WorkerLifecycleTests).
            guard let worker = randomWorker({ $0.holdsWelcome }) else { break }
            switch rng.next() % 3 {
            case 0:
                trace.append("worker \(worker.pid) says welcome at last")
                worker.welcome(identifier: identifier)
            case 1:
                let midFrame = rng.next() % 2 == 0
                trace.append("worker \(worker.pid) crashes before its handshake" + (midFrame ? " with half a frame written" : ""))
                if midFrame { worker.sendHalfAFrame() }
                worker.die(.signaled(SIGSEGV))
            default:
                trace.append("worker \(worker.pid) exits 0 before its handshake")
                worker.die(.exited(0))
            }
        default:
            let ms = rng.next() % 1500
            trace.append("clock +\(ms) ms")
            clock.advance(by: ms * 1_000_000)
        }
    }
}

/// Stands for what a request's handler holds; must be released once the request has ended.
final class Handle: Sendable {}

final class Weak {
    weak var value: Handle?
    init(_ value: Handle) { self.value = value }
}
