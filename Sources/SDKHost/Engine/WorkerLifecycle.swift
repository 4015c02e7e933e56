// A worker's life as the host sees it: one phase at a time, every change made by one function (`move`) that
// refuses an illegal change (a trap in debug builds, a no-op otherwise) and records its cause. What used
// to be re-derived from flags in several places (was it killed, and why; did it die on its own; should its
// requests wait for the next worker; does its death count as a crash) is answered once, by `ending`.
//
//      starting ──welcome──▶ ready
//         │  ╲                 │
//         │   ╲──recycle──▶ draining ──(drained)──╮
//         │                    │                  ▼
//         ├──────retire────────┴──────────────▶ retiring
//         │                                        │
//         ╰────kill (any of the above)──────────▶ killed
//                                                  │
//        exit notice (any live phase) ──▶ exiting ─┴─reaped─▶ dead   (reaped straight from any live phase too)

import SDKPosix

struct WorkerLifecycle {
    enum Phase: String, Equatable, CaseIterable, CustomStringConvertible {
        /// Spawned; `hello` sent, `welcome` not yet in. Requests may already be queued on its socket.
        case starting
        /// Its handshake is done.
        case ready
        /// Recycled (MaxRequestsPerWorker, MaxWorkerRSSMB, a reload): takes no new request, retired once drained.
        case draining
        /// Its socket is closed (idle, recycled, evicted, host stopping): it should exit; killed if it does not.
        case retiring
        /// The host sent SIGKILL (`kill` says why); its end comes next.
        case killed
        /// Its exit notice: the kernel is tearing it down. Its requests are over; it is not reaped yet.
        case exiting
        /// Reaped, or its status is gone.
        case dead

        var description: String { rawValue }

        /// Its position in `allCases`.
        var index: Int {
            switch self {
            case .starting: 0
            case .ready: 1
            case .draining: 2
            case .retiring: 3
            case .killed: 4
            case .exiting: 5
            case .dead: 6
            }
        }

        /// Starting, ready or draining: alive and not on its way out.
        var isRunning: Bool {
            switch self {
            case .starting, .ready, .draining: true
            case .retiring, .killed, .exiting, .dead: false
            }
        }
        /// Counts against MaxWorkers and may take a new request: starting or ready.
        var isLive: Bool { self == .starting || self == .ready }
        /// Its requests are over: exiting or dead.
        var isOver: Bool { self == .exiting || self == .dead }
    }

    /// One change of phase and why.
    struct Transition: Equatable {
        let from: Phase
        let to: Phase
        let cause: String
    }

    private(set) var phase = Phase.starting
    /// Whether its `welcome` arrived (in whatever phase): a worker that dies before it never ran a handler.
    private(set) var welcomed = false
    /// Why the host killed it, and whether for ignoring a cancel (the host's decision, not a death on its own).
    private(set) var kill: (reason: InterruptionReason, forCancel: Bool)?
    /// A protocol violation found in what it left on its socket, read after its end (a truncated frame, say):
    /// why its requests end, as a kill's reason would be, unless the host had killed it first.
    private(set) var violationAfterEnd: String?
    /// Its socket ended in the middle of a frame (an end of file or a reset after half a frame), before any kill:
    /// a truncated frame, unless the process died by a signal, which cut it short (`ending`).
    private(set) var truncatedFrame: String?
    /// Why it was recycled, if it was.
    private(set) var recycleReason: String?
    /// Whether it was retired (asked to exit) before it ended.
    private(set) var retired = false
    /// The last changes, oldest first (at most `historyLimit`).
    private(set) var history: [Transition] = []
    static let historyLimit = 8
    /// Told of every change (the engine's tally of transitions by kind).
    var observer: ((Transition) -> Void)?

    /// Whether `from` may become `to`.
    static func allows(_ from: Phase, _ to: Phase) -> Bool {
        switch (from, to) {
        case (.starting, .ready): return true
        case (.starting, .draining), (.ready, .draining): return true
        case (.starting, .retiring), (.ready, .retiring), (.draining, .retiring): return true
        case (.starting, .killed), (.ready, .killed), (.draining, .killed), (.retiring, .killed): return true
        case (.exiting, .dead): return true
        case (let live, .exiting), (let live, .dead): return live != .exiting && live != .dead
        default: return false
        }
    }

    /// The one place a phase changes. An illegal change traps in debug builds and changes nothing otherwise.
    @discardableResult
    mutating func move(to next: Phase, because cause: String) -> Bool {
        guard Self.allows(phase, next) else {
            assertionFailure("worker lifecycle: \(phase) → \(next) is not allowed (\(cause))")
            return false
        }
        if history.isEmpty { history.reserveCapacity(Self.historyLimit) }  // one allocation, not one per doubling
        if history.count == Self.historyLimit { history.removeFirst() }
        let transition = Transition(from: phase, to: next, cause: cause)
        history.append(transition)
        observer?(transition)
        if next == .retiring { retired = true }
        phase = next
        return true
    }

    // MARK: Events

    /// Its `welcome` arrived. False if one came already, or it is retiring (a protocol violation). A worker
    /// recycled, killed or over before its handshake was read stays in that phase, welcomed.
    mutating func welcome() -> Bool {
        guard !welcomed else { return false }
        switch phase {
        case .starting:
            welcomed = true
            return move(to: .ready, because: "welcome")
        case .draining, .killed:
            welcomed = true
            return true
        case .ready, .retiring:
            return false
        case .exiting, .dead:
            // Read from its socket after its death (the host reads what is left before it accounts for the end):
            // the handshake did happen, so a handler may have run and its requests must not be sent again.
            welcomed = true
            return true
        }
    }

    /// Takes no new request from now on and is retired once drained. False unless it was starting or ready.
    @discardableResult
    mutating func recycle(_ reason: String) -> Bool {
        guard phase == .starting || phase == .ready else { return false }
        recycleReason = reason
        return move(to: .draining, because: "recycled: \(reason)")
    }

    /// Asked to exit. False unless it was running (starting, ready or draining).
    mutating func retire(_ cause: String) -> Bool {
        guard phase.isRunning else { return false }
        return move(to: .retiring, because: cause)
    }

    /// SIGKILL is being sent for `reason`. False when it was killed already (the first reason stands) or is
    /// over: then nothing changes, and the caller still makes sure the process is gone.
    mutating func markKilled(_ reason: InterruptionReason, forCancel: Bool = false) -> Bool {
        guard kill == nil, phase != .exiting, phase != .dead else { return false }
        kill = (reason, forCancel)
        return move(to: .killed, because: "killed: \(reason)" + (forCancel ? " (ignored a cancel)" : ""))
    }

    /// What it left on its socket, read once it was over, broke the protocol. Returns whether that is why it
    /// ended: not when the host had killed it already, or another violation came first.
    @discardableResult
    mutating func brokeProtocolAfterEnd(_ detail: String) -> Bool {
        guard phase.isOver, kill == nil, violationAfterEnd == nil else { return false }
        violationAfterEnd = detail
        return true
    }

    /// Its socket ended in the middle of a frame (`detail` says how much was left). Returns whether that is
    /// recorded: not when the host had killed it already (what the kill cut short), or one was recorded before.
    @discardableResult
    mutating func endedMidFrame(_ detail: String) -> Bool {
        guard kill == nil, truncatedFrame == nil else { return false }
        truncatedFrame = detail
        return true
    }

    /// Its exit notice says the kernel is tearing it down with `status`.
    mutating func noticeExit(_ status: ExitStatus) -> Bool { move(to: .exiting, because: "exit notice: \(status)") }

    /// It was reaped (nil: its status is gone).
    @discardableResult
    mutating func reaped(_ status: ExitStatus?) -> Bool {
        move(to: .dead, because: "reaped: " + (status.map(String.init(describing:)) ?? "status unavailable"))
    }

    // MARK: Questions

    // `isRunning`, `isLive` and `isOver` are the phase's (`lifecycle.phase.isLive`): asked of a worker's stored
    // lifecycle, a question of the whole struct copied it first (a retain and a release of each of its fields),
    // and `workerWithRoom` asks for every request.
    /// Before its handshake, in a phase where the launcher's messages still count (not retiring or over).
    var beforeWelcome: Bool { !welcomed && (phase == .starting || phase == .draining || phase == .killed) }

    /// How its end is accounted for, decided once from what was recorded.
    struct Ending: Equatable {
        /// The interruption its in-flight requests end with.
        let reason: InterruptionReason
        /// Whether the death counts as a crash (a crash report, the crash tally).
        let crashed: Bool
        /// Whether it died on its own (crashed, exited, broke the protocol, hung, failed to launch) rather than
        /// being killed by the host for a cancel or at shutdown: what counts towards quarantine.
        let diedOnItsOwn: Bool
        /// Whether its requests wait for the next worker: it died on its own before its handshake (no handler
        /// ran) and the host is not stopping.
        let requeuesRequests: Bool
    }

    /// Its ending, given its exit `status`, whether requests were in flight, the launcher's failure if it
    /// reported one, and whether the host is stopping.
    func ending(status: ExitStatus?, hadRequests: Bool, livedPastIdleTimeout: Bool, launchFailure: String?,
                launcherFailureStatus: Int32, shuttingDown: Bool) -> Ending
    {
        let reason: InterruptionReason
        if let launchFailure, status == .exited(launcherFailureStatus) {
            reason = .launchFailed(launchFailure)
        } else if let kill {
            reason = kill.reason
        } else if let violationAfterEnd {
            reason = .protocolViolation(violationAfterEnd)
        } else if case .signaled(let sig)? = status {
            // A process dying by a signal (a crash) cuts short the frame it was writing: the signal is the cause.
            reason = .signal(sig)
        } else if let truncatedFrame {
            // One that exited, or lived on without its socket, sent half a frame and stopped: a truncated frame.
            reason = .protocolViolation(truncatedFrame)
        } else {
            switch status {
            case .signaled(let sig): reason = .signal(sig)
            case .exited(let code): reason = .exited(code)
            case nil: reason = .exited(-1)
            }
        }
        // An exit 0 with nothing in flight, after its handshake and its idle timeout, is a worker stopping when
        // idle (a runtime's backstop waits twice the timeout; the host retires idle workers first). Sooner, it is
        // a worker that would not stay up: a warm pool's would be started again at once, for ever, and never
        // counted towards quarantine.
        let clean = status == .exited(0) && welcomed && livedPastIdleTimeout && !hadRequests && kill == nil
            && violationAfterEnd == nil && truncatedFrame == nil
        // Half a frame left outranks a retirement: the host asking it to go does not excuse what it sent.
        let stoppedByHost = retired && (kill == nil || kill?.reason == .hostShutdown) && truncatedFrame == nil
        let crashed = !(clean || stoppedByHost)
        let onItsOwn: Bool
        switch kill?.reason {
        case nil, .protocolViolation?: onItsOwn = true
        case .hang?: onItsOwn = kill?.forCancel == false
        default: onItsOwn = false
        }
        return Ending(reason: reason, crashed: crashed, diedOnItsOwn: crashed && onItsOwn,
                      requeuesRequests: !welcomed && kill == nil && launchFailure == nil && !shuttingDown)
    }
}
