// One schedule's steps and what they record, shared by the single-threaded simulation (Simulation.swift) and
// the suite's threaded variant, where the engine keeps its own loop thread.
import SDKWire
import SDKHost
import SDKPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// What a schedule has done so far: the requests it began and how each ended, the partial results the app took,
/// the handlers that must be released, and a trace of its steps for a failure's report.
package final class ScheduleState: @unchecked Sendable {
    // @unchecked Sendable: `outcomes` and `partials` are locked (the loop thread delivers into them); the rest is
    // the simulating thread's alone.
    package let identifier: String
    package private(set) var begun: [RequestID] = []
    package var trace: [String] = []
    package let outcomes = Mutex<[RequestID: [RequestOutcome]]>([:])
    /// Partial results the app took per request, and the first request that had one after its outcome.
    package let partials = Mutex<(taken: [RequestID: Int], afterEnd: RequestID?)>(([:], nil))
    /// A request that was sent to a worker after it had ended, if any.
    package private(set) var lateBegin: RequestID?
    private var handles: [Weak] = []
    /// Requests that had ended when the previous pump started: a begin read now was written after that pump
    /// (everything before it was flushed), so it must not be for one of these.
    private var endedBeforeLastPump: Set<RequestID> = []

    package init(identifier: String) { self.identifier = identifier }

    /// Whether a handler of a request is still retained.
    package var retainsAHandler: Bool { handles.contains { $0.value != nil } }

    /// Lets every live fake worker read what the host sent and answer what a runtime answers by itself (hello,
    /// ping); a worker the host killed dies, one whose socket the host closed exits.
    package func pumpWorkers(_ launcher: SimLauncher) {
        let endedNow = Set(outcomes.withLock { $0.keys })
        defer { endedBeforeLastPump = endedNow }
        // One poll for all of them: most have nothing to read at a given step, and asking each (a read that says
        // EAGAIN, then a peek for end-of-file) was most of the simulation's system calls.
        var alive: [FakeWorker] = []
        for worker in launcher.workers where worker.alive {
            if worker.shared.withLock({ $0.killRequested }) {
                worker.die(.signaled(SIGKILL))
            } else {
                alive.append(worker)
            }
        }
        guard !alive.isEmpty else { return }
        var polled = alive.map { pollfd(fd: $0.socket, events: Int16(POLLIN), revents: 0) }
        _ = poll(&polled, nfds_t(polled.count), 0)
        for (worker, entry) in zip(alive, polled) where entry.revents != 0 {
            let seen = worker.begins.count
            let endOfFile = worker.pump(identifier: identifier)
            if lateBegin == nil, let late = worker.begins[seen...].first(where: endedBeforeLastPump.contains) {
                lateBegin = late
            }
            if endOfFile { worker.die(.exited(0)) }
        }
    }

    /// One step drawn from `rng`: a begin (with or without a deadline; with `apps`, half from one of three
    /// daemon apps), a cancel, a worker that completes (sometimes twice), acknowledges a cancel, sends a partial
    /// result (sometimes a burst past the credit window), crashes, exits or replies for an unknown id, a spawn
    /// that fails, or the clock moving.
    package func step(_ rng: inout SimulationRandom, engine: HostEngine, launcher: SimLauncher, clock: ManualClock,
                      apps: Bool)
    {
        func randomWorker(_ which: (FakeWorker) -> Bool) -> FakeWorker? {
            let candidates = launcher.workers.filter { $0.alive && which($0) }
            return candidates.isEmpty ? nil : candidates[Int(rng.next() % UInt64(candidates.count))]
        }
        func short(_ id: RequestID) -> Substring { id.uuidString.prefix(8) }
        switch rng.next() % 100 {
        case 0..<25:
            let id = RequestID(high: rng.next(), low: rng.next())
            let deadline: Double? = rng.next() % 10 < 3 ? Double(rng.next() % 3000 + 1) / 1000 : nil
            let app: String? = apps && rng.next() % 2 == 0 ? "0/app\(rng.next() % 3)" : nil
            let handle = Handle()
            handles.append(Weak(handle))
            begun.append(id)
            trace.append("begin \(short(id)) deadline \(deadline.map { "\($0)" } ?? "-")" + (app.map { " app \($0)" } ?? ""))
            engine.submit(SubmittedRequest(
                id: id, extensionID: identifier, items: [ExtensionItem(title: "sim")], deadline: deadline,
                onWorkerAssigned: nil,
                deliver: { [self, handle] outcome in
                    withExtendedLifetime(handle) { self.outcomes.withLock { $0[id, default: []].append(outcome) } }
                },
                progress: { [self, handle, engine] _ in
                    withExtendedLifetime(handle) {
                        let over = self.outcomes.withLock { $0[id] != nil }
                        self.partials.withLock { p in
                            p.taken[id, default: 0] += 1
                            if over, p.afterEnd == nil { p.afterEnd = id }
                        }
                        engine.credit(id, 1)  // the app has it
                    }
                },
                app: app))
        case 25..<35:
            guard !begun.isEmpty else { break }
            let id = begun[Int(rng.next() % UInt64(begun.count))]
            trace.append("cancel \(short(id))")
            engine.cancel(id)
        case 35..<60:
            guard let worker = randomWorker({ !$0.pending.isEmpty }) else { break }
            let id = worker.pending.remove(at: Int(rng.next() % UInt64(worker.pending.count)))
            trace.append("worker \(worker.pid) completes \(short(id))")
            worker.send(.complete(id: id, items: [ExtensionItem(title: "done")]))
            if rng.next() % 10 == 0 {
                trace.append("worker \(worker.pid) completes \(short(id)) again")
                worker.send(.complete(id: id, items: [ExtensionItem(title: "again")]))
            }
        case 60..<65:
            guard let worker = randomWorker({ !$0.cancelRequested.isEmpty }) else { break }
            let id = worker.cancelRequested.removeFirst()
            worker.pending.removeAll { $0 == id }
            trace.append("worker \(worker.pid) acknowledges the cancel of \(short(id))")
            worker.send(.cancelled(id: id, error: .cancelledByHost))
        case 65..<70:
            guard let worker = randomWorker({ _ in true }) else { break }
            trace.append("worker \(worker.pid) crashes")
            worker.die(.signaled(SIGSEGV))
        case 70..<73:
            guard let worker = randomWorker({ _ in true }) else { break }
            trace.append("worker \(worker.pid) exits")
            worker.die(.exited(0))
        case 73..<75:
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
            for _ in 0..<count { worker.send(.partial(id: id, items: [ExtensionItem(title: "part")])) }
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
